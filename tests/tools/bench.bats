#!/usr/bin/env bats
# bench.bats: the measuring tools behind `make bench` and the kernel breakdown
# (common/scripts/bench.sh, common/python/kernel_breakdown.py). What needs a GPU or PyTorch
# (ncu, the PyTorch side) is not run here; the CSV arithmetic and the plot are.

load ../helpers

# quotes_refuse FILE WORDS: check_quotes.py's rules (--list runs nothing) refuse FILE, saying WORDS.
quotes_refuse() {
    run python3 "$REPO/common/python/check_quotes.py" --file "$1" --list
    assert_failure
    assert_output --partial "$2"
}

@test "kernel_breakdown sums an ncu report per kernel and sorts kernels into kinds" {
    dir="$(scratch)"
    # Nsight Compute's --csv layout: its own log lines, then one quoted row per (launch, metric).
    cat >"$dir/ncu.csv" <<'EOF'
==PROF== Connected to process 1
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","train","h","sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","1,000.5"
"1","1","train","h","void attention_dkdv_kernel<64, 1>(float *, int)","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","2500"
"2","1","train","h","sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8","1","7","(128, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","499.5"
"3","1","train","h","layernorm_forward_kernel(float *, int)","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ms","0.25"
"5","1","train","h","nvjet_sm90_tss_192x128_64x5_1x2_h_badd_coopB_NNT","1","7","(384, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","4"
"6","1","train","h","cast_to_half_kernel(unsigned short *, const float *, unsigned long, HalfFormat)","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","5"
"4","1","train","h","mystery_kernel(int)","1","7","(256, 1, 1)","(4, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","3"
EOF
    run python3 "$REPO/common/python/kernel_breakdown.py" ncu "$dir/ncu.csv" after "$dir/after.csv"
    assert_success
    assert_output --partial "1.76 ms of kernels in one step" # 1000.5 + 2.5 + 499.5 + 250 + 3 + 4 + 5 us
    assert_equal "$(head -1 "$dir/after.csv")" "label,category,kernel,calls,time_us"
    # the two GEMM launches are one row: 2 calls, 1000.5 + 499.5 us
    run grep -c "" "$dir/after.csv"
    assert_output 7
    assert_equal "$(sed -n 2p "$dir/after.csv")" \
        "after,matmul,sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8,2,1500.000"
    run grep -E '^after,attention,void attention_dkdv_kernel<64; 1>\(float \*; int\),1,2.500$' "$dir/after.csv"
    assert_success
    run grep -E '^after,norm,layernorm_forward_kernel\(float \*; int\),1,250.000$' "$dir/after.csv"
    assert_success
    run grep -E '^after,other,mystery_kernel\(int\),1,3.000$' "$dir/after.csv"
    assert_success
    # Hopper's cuBLAS names its GEMMs nvjet_*; the course's precision casts are a kind of their own
    run grep -E '^after,matmul,nvjet_sm90_tss_192x128_64x5_1x2_h_badd_coopB_NNT,1,4.000$' "$dir/after.csv"
    assert_success
    run grep -E '^after,cast,cast_to_half_kernel\(unsigned short \*; const float \*; unsigned long; HalfFormat\),1,5.000$' "$dir/after.csv"
    assert_success

    run "$(plot_python)" "$REPO/common/python/kernel_breakdown.py" plot "$dir/breakdown.png" "$dir/after.csv" "$dir/after.csv"
    assert_success
    [ -s "$dir/breakdown.png" ]
}

@test "kernel_breakdown turns perf's samples into CPU time per step and sorts CPU symbols into kinds" {
    dir="$(scratch)"
    # perf report --no-children --sort symbol -n -g none: percent, samples, [.] user / [k] kernel, symbol
    cat >"$dir/report.txt" <<'EOF'
# Samples: 1K of event 'cpu-clock:ppp'
    60.00%           600  [.] sgemm_kernel_ZEN                      -      -
    20.00%           200  [.] gelu_forward_block.arch_x86_64_v3    -      -
    10.00%           100  [.] softmax_row.arch_x86_64_v3           -      -
     5.00%            50  [.] layernorm_forward_row.default        -      -
     5.00%            50  [k] clear_page_erms                      -      -
EOF
    # 1000 samples at 500 Hz over 4 steps: 2 s of CPU, 0.5 s per step
    run python3 "$REPO/common/python/kernel_breakdown.py" perf "$dir/report.txt" 500 4 cpu "$dir/cpu.csv"
    assert_success
    assert_output --partial "500.00 ms of kernels in one step"
    assert_equal "$(sed -n 2p "$dir/cpu.csv")" "cpu,matmul,sgemm_kernel_ZEN,600,300000.000"
    run grep -c -E '^cpu,(elementwise,gelu_forward_block|attention,softmax_row|norm,layernorm_forward_row|other,\[kernel\] clear_page_erms)' "$dir/cpu.csv"
    assert_output 4
}

@test "kernel_breakdown writes its CSV and PNG only at a new name or over its own, and refuses a text file or a directory" {
    dir="$(scratch)" text="$REPO/tests/fixtures/text.txt"
    printf '    60.00%%           600  [.] sgemm_kernel_ZEN  -  -\n' >"$dir/report.txt"
    run python3 "$REPO/common/python/kernel_breakdown.py" perf "$dir/report.txt" 500 4 cpu "$dir/cpu.csv"
    assert_success
    run python3 "$REPO/common/python/kernel_breakdown.py" perf "$dir/report.txt" 500 2 cpu "$dir/cpu.csv"
    assert_success
    assert_equal "$(sed -n 2p "$dir/cpu.csv")" "cpu,matmul,sgemm_kernel_ZEN,600,600000.000"
    cp "$text" "$dir/notes.txt"
    run --separate-stderr python3 "$REPO/common/python/kernel_breakdown.py" perf "$dir/report.txt" 500 4 cpu "$dir/notes.txt"
    assert_equal "$status" 2
    assert_equal "$stderr" "kernel_breakdown: OUT_CSV $dir/notes.txt: exists and is not a kernel_breakdown CSV (valid: a new name or an earlier kernel_breakdown CSV)"
    cmp "$dir/notes.txt" "$text"
    mkdir "$dir/d.csv"
    run --separate-stderr python3 "$REPO/common/python/kernel_breakdown.py" perf "$dir/report.txt" 500 4 cpu "$dir/d.csv"
    assert_equal "$status" 2
    assert_equal "$stderr" "kernel_breakdown: OUT_CSV $dir/d.csv: is a directory (valid: a file name)"
    run --separate-stderr "$(plot_python)" "$REPO/common/python/kernel_breakdown.py" plot "$dir/notes.txt" "$dir/cpu.csv"
    assert_equal "$status" 2
    assert_equal "$stderr" "kernel_breakdown: OUT_PNG $dir/notes.txt: exists and is not a PNG matplotlib wrote (valid: a new name or an earlier PNG matplotlib wrote)"
    cmp "$dir/notes.txt" "$text"
    "$(plot_python)" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    for i in 1 2; do  # a new name, then over its own
        run "$(plot_python)" "$REPO/common/python/kernel_breakdown.py" plot "$dir/b.png" "$dir/cpu.csv"
        assert_success
    done
}

@test "bench on the CPU measures bf16 mixed precision beside fp32 by default" {
    dir="$(scratch)"
    if python3 -c 'import torch' 2>/dev/null; then
        skip "PyTorch is importable here: this test is about the course-only path"
    fi
    run env BENCH_MODELS=tiny BENCH_REPEATS=1 BENCH_STEPS=3 BENCH_VARIANTS=0 BENCH_OUT="$dir/bench" \
        "$REPO/common/scripts/bench.sh"
    assert_success
    assert_equal "$(csv_column "$dir/bench/bench.csv" precision | tr '\n' ' ')" "fp32 bf16 "
    assert_equal "$(csv_column "$dir/bench/compare.csv" precision | sort | tr '\n' ' ')" "bf16 fp32 "
    grep -q -- '--precision=bf16' "$dir/bench/runs/tiny-bf16-headline-r1/run-info.txt"
}

@test "bench leaves COURSE_TF32 unset for fp32 and bf16 runs (0 would hold a 16-bit run's attention to strict fp32)" {
    dir="$(scratch)"
    if python3 -c 'import torch' 2>/dev/null; then
        skip "PyTorch is importable here: this test is about the course-only path"
    fi
    # the course's program behind a wrapper that notes what it was given
    printf '#!/bin/bash\necho "${COURSE_TF32-unset}" >>"%s/tf32.txt"\nexec "%s/01_single_gpu/train" "$@"\n' \
        "$dir" "$REPO" >"$dir/train"
    chmod +x "$dir/train"
    run env COURSE_TF32=0 TRAIN="$dir/train" BENCH_MODELS=tiny BENCH_REPEATS=1 BENCH_STEPS=3 BENCH_VARIANTS=0 \
        BENCH_OUT="$dir/bench" "$REPO/common/scripts/bench.sh"
    assert_success
    assert_equal "$(tr '\n' ' ' <"$dir/tf32.txt")" "unset unset "
}

@test "bench on the CPU writes the documented columns, each run's settings and the median over repeats" {
    dir="$(scratch)"
    # Without PyTorch, the course's rows alone, and empty PyTorch columns.
    if python3 -c 'import torch' 2>/dev/null; then
        skip "PyTorch is importable here: this test is about the course-only path"
    fi
    run env BENCH_MODELS=tiny BENCH_REPEATS=3 BENCH_STEPS=3 BENCH_PRECISIONS=fp32 BENCH_OUT="$dir/bench" \
        "$REPO/common/scripts/bench.sh"
    assert_success
    assert_output --partial "skipping the PyTorch comparison"
    assert_equal "$(head -1 "$dir/bench/bench.csv")" \
        "device,program,model,precision,variant,settings,batch,seq,params,repeat,median_step_ms,tokens_per_s,peak_device_bytes"
    assert_equal "$(csv_column "$dir/bench/bench.csv" program | sort -u)" "01_single_gpu"
    # interleaved: each repeat runs the headline setting and the alternative one
    assert_equal "$(csv_column "$dir/bench/bench.csv" repeat | tr '\n' ' ')" "1 1 2 2 3 3 "
    assert_equal "$(csv_column "$dir/bench/bench.csv" variant | sort | uniq -c | awk '{print $1 $2}' | tr '\n' ' ')" \
        "3alternative 3headline "
    assert_equal "$(awk -F, '$5 == "headline" { print $6 }' "$dir/bench/bench.csv" | sort -u)" \
        "OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive"
    assert_equal "$(csv_column "$dir/bench/bench.csv" params | sort -u)" "136960"
    assert_equal "$(head -1 "$dir/bench/compare.csv")" \
        "device,model,precision,variant,course_tokens_per_s,course_min,course_max,eager_tokens_per_s,eager_min,eager_max,ratio_eager,ratio_eager_low,ratio_eager_high,verdict,compile_tokens_per_s,ratio_compile,course_peak_bytes,eager_peak_bytes,model_tflop_per_step,course_mfu,eager_mfu,compile_mfu"
    # compare.csv's headline course column is the median of the three headline runs, with their min and max
    sorted="$(awk -F, '$5 == "headline" { print $12 }' "$dir/bench/bench.csv" | sort -g)"
    headline="$(grep ',headline,' "$dir/bench/compare.csv")"
    # (formatted by Python, as compare.csv is: printf may round the last digit the other way)
    assert_equal "$(echo "$headline" | cut -d, -f5-7)" \
        "$(python3 -c 'import sys; lo, mid, hi = sorted(map(float, sys.argv[1:])); print(f"{mid:.1f},{lo:.1f},{hi:.1f}")' $sorted)"
    # 6P + 12 L T C FLOPs per token, 8 x 64 tokens: (6*136960 + 12*2*64*64) * 512 / 1e12
    assert_equal "$(echo "$headline" | cut -d, -f19)" "0.0005"
    assert_equal "$(echo "$headline" | cut -d, -f11)" "" # no PyTorch, no ratio
    # the prefetch and overlap row (common/scripts/bench_zero.sh): both settings, a gain each
    assert_equal "$(awk -F, 'NR > 1 && $11 != "" { print $5 "," $6 }' "$dir/bench/zero_summary.csv" | sort | tr '\n' ' ')" \
        "default,dp_overlap default,zero3 recommended,dp_overlap recommended,zero3 "
}

@test "bench_zero runs each configuration in both thread settings, interleaved, and writes its CSVs with the gains" {
    dir="$(scratch)"
    run env BENCH_RANKS=2 BENCH_REPEATS=2 BENCH_MODEL=tiny BENCH_STEPS=3 BENCH_OUT="$dir/z" \
        BENCH_CONFIGS="zero0 zero3 zero3_prefetch0 dp_flat dp_overlap" "$REPO/common/scripts/bench_zero.sh"
    assert_success
    assert_equal "$(head -1 "$dir/z/zero.csv")" \
        "device,precision,model,ranks,settings,config,repeat,median_step_ms,median_comm_ms,median_comm_busy_ms,bytes_sent_per_step"
    # interleaved: repeat 1 of every setting and configuration, then repeat 2
    assert_equal "$(csv_column "$dir/z/zero.csv" repeat | uniq -c | awk '{ print $1 "x" $2 }' | tr '\n' ' ')" "10x1 10x2 "
    assert_equal "$(awk -F, 'NR > 1 && NR <= 11 { print $5 "/" $6 }' "$dir/z/zero.csv" | tr '\n' ' ')" \
        "recommended/zero0 recommended/zero3 recommended/zero3_prefetch0 recommended/dp_flat recommended/dp_overlap default/zero0 default/zero3 default/zero3_prefetch0 default/dp_flat default/dp_overlap "
    # every run has its step time and comm times; ZeRO runs their bytes
    awk -F, 'NR > 1 && ($8 <= 0 || $9 == "" || $10 == "" || ($6 ~ /^zero/ && $11 <= 0)) { bad = 1 } END { exit bad }' "$dir/z/zero.csv"
    assert_equal "$(head -1 "$dir/z/zero_summary.csv")" \
        "device,precision,model,ranks,settings,config,median_step_ms,min_step_ms,max_step_ms,relative_to_stage0,gain,gain_min,gain_max"
    # the gain is the baseline's time over this one's, within each repeat: its median lies in min..max
    python3 - "$dir/z/zero_summary.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 10, rows
for r in rows:
    has_gain = r["config"] in ("zero3", "dp_overlap")
    assert bool(r["gain"]) == has_gain, r
    if has_gain:
        assert float(r["gain_min"]) <= float(r["gain"]) <= float(r["gain_max"]), r
    assert r["relative_to_stage0"] != "", r
EOF
}

@test "the real GPipe and 1F1B schedules take 3(M+P-1) slots, as the bubble formula says" {
    for pm in "2 1" "3 2" "4 8" "3 5"; do
        read -r P M <<<"$pm"
        for schedule in gpipe 1f1b; do
            run python3 "$REPO/common/python/concepts.py" --slots "$schedule" "$P" "$M"
            assert_success
            assert_line --index 0 "$schedule, P = $P, M = $M: $((3 * (M + P - 1))) slots"
        done
    done
}

@test "the concept drawings of chapters 02-05 are generated" {
    dir="$(scratch)/concepts"
    run "$(plot_python)" "$REPO/common/python/concepts.py" "$dir"
    assert_success
    for png in ring-allreduce tensor-parallel pipeline-slots rank-grid formats; do
        [ -s "$dir/$png.png" ]
    done
}

@test "concepts.py draws over its own earlier drawings, and refuses a text file or a directory at a drawing's name" {
    local dir="$(scratch)/concepts" text="$REPO/tests/fixtures/text.txt"
    mkdir -p "$dir"
    cp "$text" "$dir/formats.png"
    run --separate-stderr "$(plot_python)" "$REPO/common/python/concepts.py" "$dir"
    assert_equal "$status" 2
    assert_equal "$stderr" "concepts: OUT_DIR $dir/formats.png: exists and is not a PNG matplotlib wrote (valid: a new name or an earlier PNG matplotlib wrote)"
    cmp "$dir/formats.png" "$text"
    [ ! -e "$dir/ring-allreduce.png" ] # refused before any drawing
    rm "$dir/formats.png"
    mkdir "$dir/formats.png"
    run --separate-stderr "$(plot_python)" "$REPO/common/python/concepts.py" "$dir"
    assert_equal "$status" 2
    assert_equal "$stderr" "concepts: OUT_DIR $dir/formats.png: is a directory (valid: a file name)"
    cp "$text" "$(scratch)/notes.txt"
    run --separate-stderr "$(plot_python)" "$REPO/common/python/concepts.py" "$(scratch)/notes.txt"
    assert_equal "$status" 2
    assert_equal "$stderr" "concepts: OUT_DIR $(scratch)/notes.txt: exists and is not a directory (valid: a new name or a directory)"
    cmp "$(scratch)/notes.txt" "$text"
    "$(plot_python)" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
    rmdir "$dir/formats.png"
    for i in 1 2; do # new names, then over its own drawings
        run "$(plot_python)" "$REPO/common/python/concepts.py" "$dir"
        assert_success
    done
}

@test "the formats drawing's numbers follow from the bit counts as half.h's table says" {
    run python3 -c "import sys; sys.path.insert(0, '$REPO/common/python'); import concepts
for name, e, m in concepts.FORMATS: print(name, *('%.4g' % x for x in concepts.format_numbers(e, m)))"
    assert_success
    assert_line "fp32 3.403e+38 1.175e-38 1.401e-45 1.192e-07"
    assert_line "bf16 3.39e+38 1.175e-38 9.184e-41 0.007812"
    assert_line "fp16 6.55e+04 6.104e-05 5.96e-08 0.0009766"
}

@test "the speed problems' reference answers grade as right, and wrong or missing ones as wrong" {
    dir="$(scratch)"
    python3 "$REPO/common/python/speed.py" answers >"$dir/right.txt"
    run python3 "$REPO/common/python/speed.py" grade "$dir/right.txt"
    assert_success
    assert_output --partial "8/8 problems right"
    # 6P + 12LTC for the 7B model, by hand: 42e9 + 12*32*4096*4096
    assert_equal "$(sed -n 1p "$dir/right.txt")" "1 4.84425e+10"
    # one answer 2% off, one missing: two wrong
    sed -e 's/^1 .*/1 4.94e10/' -e '/^8 /d' "$dir/right.txt" >"$dir/wrong.txt"
    run python3 "$REPO/common/python/speed.py" grade "$dir/wrong.txt"
    assert_failure
    assert_output --partial "FAIL problem 1"
    assert_output --partial "FAIL problem 8: missing"
    assert_output --partial "6/8 problems right"
}

@test "the breakdown's parts add up to the median step time, with 'other' for the rest" {
    run "$(plot_python)" - "$REPO/common/python" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import plot_runs as plot  # the figures of plot.py's default mode
def step(fwd, bwd, opt, comm, total):
    return {"fwd_ms": fwd, "bwd_ms": bwd, "opt_ms": opt, "comm_ms": comm, "step_ms": total}
# the warm-up step is left out; the medians of 3 steps are 10, 20, 2, 1 and 40 ms
runs = [{"steps": [step(99, 99, 99, 99, 999), step(10, 20, 2, 1, 40), step(9, 19, 2, 1, 38), step(11, 21, 3, 2, 41)]}]
parts = plot.breakdown_parts(runs)
print(parts["other"], parts["step_ms"])
assert parts["other"] == 40 - (10 + 20 + 2 + 1), parts
# overlapping parts (a pipeline stage's waits inside forward and backward): other < 0
over = plot.breakdown_parts([{"steps": [step(1, 1, 1, 1, 1), step(10, 20, 2, 1, 25)]}])
assert over["other"] == 25 - 33, over
PY
    assert_success
    assert_output "7.0 40.0"
}

@test "every output course.md quotes is what the visible commands above it print now" {
    # all of them, in the order of the text, in a scratch copy whose runs/ starts empty
    run python3 "$REPO/common/python/check_quotes.py"
    assert_success
    refute_output --partial "FAIL"
    assert_output --regexp "check_quotes: ([0-9]+) of \1 quoted outputs match"
}

@test "the quote checker catches a quoted output that differs from the run, and --update fixes it" {
    # chapter 01's memory.csv, its grads row changed by one byte; --only runs that block alone
    dir="$(scratch)"
    grads=$(sed -n 's/^0,device,grads,\([0-9]*\)$/\1/p' "$REPO/course.md" | head -1)
    [ -n "$grads" ] # the block was found
    sed "0,/^0,device,grads,$grads\$/s//0,device,grads,$((grads + 1))/" "$REPO/course.md" >"$dir/course.md"
    ! cmp -s "$REPO/course.md" "$dir/course.md" # the edit took
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/course.md" --only "cat runs/01-small/memory.csv"
    assert_failure
    assert_output --partial "-0,device,grads,$((grads + 1))"
    assert_output --partial "+0,device,grads,$grads"
    assert_output --partial "check_quotes: 0 of 1 quoted outputs match"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/course.md" --only "cat runs/01-small/memory.csv" --update
    assert_success
    cmp "$REPO/course.md" "$dir/course.md"
}

@test "the quote checker fails a block whose command fails, even inside a pipe, and never rewrites its output" {
    dir="$(scratch)"
    cat >"$dir/fail.md" <<'MD'
A refusal hidden by a filter:

```sh check
./01_single_gpu/train --device cpu --steps 1 --no-such-flag --overwrite --out runs/t-fail 2>&1 | cat
echo "not reached"
```
```
error: unknown flag '--no-such-flag' (see --help)
not reached
```
MD
    cp "$dir/fail.md" "$dir/before.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/fail.md" --update
    assert_failure
    assert_output --partial "the commands exited with status 2"
    refute_output --partial "| not reached" # the block stopped at the failing pipe
    assert_output --partial "the commands of 1 failed"
    cmp "$dir/before.md" "$dir/fail.md"
}

@test "the quote checker runs the blocks in order in a fresh runs/, and a command meant to fail says so" {
    mkdir -p "$REPO/runs"
    touch "$REPO/runs/.check_quotes_test_marker"
    dir="$(scratch)"
    cat >"$dir/order.md" <<'MD'
```sh check
ls -A runs | wc -l
echo one > runs/t-order.txt
```

```
0
```

The next block reads what the one before wrote; the repository's path reads `...`:

```sh check
cat runs/t-order.txt
ls -d "$(cd 01_single_gpu && pwd -P)"
false || echo "exit status $?"
```
```text
one
.../01_single_gpu
exit status 1
```
MD
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/order.md"
    rm -f "$REPO/runs/.check_quotes_test_marker"
    assert_success
    assert_output --partial "check_quotes: 2 of 2 quoted outputs match"
    [ ! -e "$REPO/runs/t-order.txt" ] # the repository's runs/ was not touched
}

@test "the quote checker refuses blocks a reader could not run as written, or run twice" {
    dir="$(scratch)"
    block() { printf '```sh check\n%s\n```\n```\n```\n\n' "$@"; }
    block './01_single_gpu/train --out runs/t-a' >"$dir/again.md"
    quotes_refuse "$dir/again.md" "--out runs/t-a without --overwrite: the block fails when run again"
    { block './01_single_gpu/train --overwrite --out runs/t-a'; block './05_zero/train --save runs/t-a --overwrite --out runs/t-b'; } >"$dir/twice.md"
    quotes_refuse "$dir/twice.md" "--save runs/t-a is already written by the block at line 1"
    block './01_single_gpu/train --overwrite --out $TMP/x' >"$dir/tmp.md"
    quotes_refuse "$dir/tmp.md" "--out \$TMP/x: write under runs/"
    printf '<!-- check: echo hi -->\n```\nhi\n```\n' >"$dir/hidden.md"
    quotes_refuse "$dir/hidden.md" "hidden.md:1: a command hidden in a comment"
    printf '```sh check\necho hi\n```\nprose\n```\nhi\n```\n' >"$dir/lost.md"
    quotes_refuse "$dir/lost.md" "must be followed by the fenced block of its output"
}

@test "every block of course.md runs as pasted, again: no two commands share an --out, the launcher, no history" {
    # the rules alone (--list runs nothing): issue 36 items 15 and 18
    run python3 "$REPO/common/python/check_quotes.py" --list
    assert_success
    dir="$(scratch)"
    # a "Running it" block whose two runs take the default --out runs/02_data_parallel
    printf '```\n%s\n%s\n```\n' \
        'common/scripts/mpirun.sh -np 2 ./02_data_parallel/train --model small --steps 40' \
        'common/scripts/mpirun.sh -np 4 ./02_data_parallel/train --model small --steps 40 --dp-mode overlap' >"$dir/default.md"
    quotes_refuse "$dir/default.md" "default.md:1: two commands of this block write --out runs/02_data_parallel and the later has no --overwrite"
    # one --out given twice, once with --overwrite: only the run without it is refused
    printf '```sh\n%s\n%s\n%s\n```\n' './04_pipeline/train --out runs/t-x' './04_pipeline/train --steps 3 --out runs/t-x --overwrite' \
        './04_pipeline/train --print-schedule' >"$dir/overwrite.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/overwrite.md" --list
    assert_success
    printf '```\n%s\n%s\n```\n' './03_model_parallel/train --out runs/t-x' './03_model_parallel/train --steps 3 --out=runs/t-x' >"$dir/same.md"
    quotes_refuse "$dir/same.md" "write --out runs/t-x and the later has no --overwrite"
    # plain mpirun: in a block, and as `code` in the prose (even wrapped); across machines it stays
    printf '```\nmpirun -np 2 ./02_data_parallel/train\n```\n' >"$dir/mpirun-block.md"
    quotes_refuse "$dir/mpirun-block.md" "mpirun-block.md:1: plain mpirun"
    printf 'Run it (`mpirun -np 2\n./05_zero/train --zero 3`) now.\n' >"$dir/mpirun-prose.md"
    quotes_refuse "$dir/mpirun-prose.md" "mpirun-prose.md:1: plain mpirun in \`mpirun -np 2 ./05_zero/train --zero 3\`"
    printf '```\n%s\n```\nThe error reads `(valid: mpirun -np 2)`; `common/scripts/mpirun.sh -np 2 ./02_data_parallel/train`.\n' \
        'mpirun -np 8 --hostfile hosts ./04_pipeline/train --out runs/two' >"$dir/mpirun-ok.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/mpirun-ok.md" --list
    assert_success
    # development history in the prose
    printf 'The issue'"'"'s configuration, before (d228adb).\n\nSee issue 36 and commit 74b00f8.\n\n```\n(d228adb) in an output\n```\n' \
        >"$dir/history.md"
    quotes_refuse "$dir/history.md" "history.md:1: development history ('The issue')"
    assert_output --partial "history.md:1: development history ('(d228adb)')"
    assert_output --partial "history.md:3: development history ('issue 36')"
    assert_output --partial "history.md:3: development history ('commit 74b00f8')"
    refute_output --partial "history.md:6"
}

@test "course.md's cheapest pasted blocks (02's Running it, 01's resume, 05's move) run twice in a fresh clone; a block that fails again is caught" {
    # the cheapest of course.md's `sh run` blocks, about 25 s (all of them: check_quotes.py --pasted, minutes): issue 36 item 15
    run python3 "$REPO/common/python/check_quotes.py" --pasted --only "./02_data_parallel/train --model small --steps 40" \
        --only "--save runs/01-first.ck" --only "--save runs/05-move.ck"
    assert_success
    assert_output --partial "check_quotes: 3 of 3 pasted blocks ran twice"
    dir="$(scratch)"
    printf '```sh run\nmkdir runs/t-once\n```\n' >"$dir/once.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/once.md" --pasted
    assert_failure
    assert_output --partial "the second run exited with status 1"
    assert_output --partial "check_quotes: 0 of 1 pasted blocks ran twice"
    printf '```sh run\n./01_single_gpu/train --steps 1 --out runs/t-a\n```\n' >"$dir/again.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/again.md" --pasted
    assert_failure
    assert_output --partial "--out runs/t-a without --overwrite: the block fails when run again"
}

@test "course.md places the axes by one rule, and its numbers are the measured bytes it quotes" {
    # issue 36 item 16: "Choosing the axes" and "Beyond one machine" say the same order (tp innermost
    # on the fastest links, then cp and pp, dp outermost on the slowest), against the quoted run.csv
    row=$(grep -A1 '^world_size,dp,tp,pp,bytes_dp_per_step,bytes_pp_per_step,bytes_cp_per_step,bytes_tp_per_step$' \
        "$REPO/course.md" | sed -n 2p)
    IFS=, read -r world dp tp pp bytes_dp bytes_pp bytes_cp bytes_tp <<<"$row"
    [ "$world" = 8 ] && [ "$bytes_cp" = 0 ]
    (( bytes_tp > bytes_dp && bytes_dp > bytes_pp )) # tp most; dp more than pp, yet outermost
    comma() { sed ':a; s/\B[0-9]\{3\}\>/,&/; ta' <<<"$1"; }
    text=$(tr '\n' ' ' <"$REPO/course.md" | tr -s ' ')
    [[ "$text" == *"dp sends about $(( (bytes_dp + bytes_pp / 2) / bytes_pp )) times pp's bytes ($(comma "$bytes_dp") against $(comma "$bytes_pp"))"* ]]
    # the blocks' 4L(T-1)/(T(PV-1)), 8 here, and the vocabulary split's bytes on top: over it
    [[ "$text" == *"pp sends over 4L(T-1) / (T(PV-1)) times less ($(( bytes_tp / bytes_pp ))x here: 8x the blocks' alone,"* ]]
    # the rule, said the same way in both places; nothing puts dp on the fastest links
    [[ "$text" == *"tp varies fastest, then cp, then pp, then dp"* ]]
    [[ "$text" == *"and data parallelism, which waits only at the optimizer step and hides under the backward pass, outermost, over the slowest links."* ]]
    [[ "$text" != *"then the data-parallel all-reduce) on the fastest"* ]]
    [[ "$text" != *"the pipeline is the split that goes over the slowest links"* ]]
}

@test "demo_tables prints medians over the steps of every repeat, the warm-up step left out" {
    dir="$(scratch)/demo"
    header="step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss,comm_busy_ms"
    for r in 1 2; do
        mkdir -p "$dir/01-small.r$r" "$dir/02-dp2-flat.r$r"
        printf '%s\n1,5,0,0,999,9,9,0,9,0,,\n2,5,0,0,%d,1,2,0,3,0,,\n3,5,0,0,%d,1,2,0,3,0,,\n' "$header" $((10 * r)) $((10 * r + 2)) \
            >"$dir/01-small.r$r/steps.csv"
        printf '%s\n1,5,0,0,999,9,9,9,9,0,,9\n2,5,0,0,30,4,5,1,6,0,,0.5\n' "$header" >"$dir/02-dp2-flat.r$r/steps.csv"
    done
    run python3 "$REPO/common/python/demo_tables.py" "$dir"
    assert_success
    # 01: steps 10, 12, 20, 22 (the 999 warm-up steps left out): median 16
    assert_line "| 01, one process | 16.0 ms | 1.0 | 2.0 | 3.0 | 0.0 | - |"
    assert_line "| 02-dp2-flat | 30.0 ms | 4.0 | 5.0 | 6.0 | 1.0 | 0.5 |"
}

@test "lib.sh's column reads a column by name (nothing for a missing one) and median takes the middle" {
    printf 'a,b,c\n1,x,30\n2,y,10\n3,z,20\n' >"$(scratch)/t.csv"
    assert_equal "$(column "$(scratch)/t.csv" b | tr '\n' ' ')" "x y z "
    assert_equal "$(column "$(scratch)/t.csv" d)" ""
    assert_equal "$(column "$(scratch)/t.csv" c | median)" "20"
    assert_equal "$(column "$(scratch)/t.csv" c | tail -n +2 | median)" "15"
    assert_equal "$(printf '9\n100\n10\n' | median)" "10"   # numerically, not as text
    assert_equal "$(printf '' | median)" ""
    # a name written twice is its first column, for column and csv_awk alike (calibrate.sh's own reader took the last)
    printf 'a,b,a\n1,x,3\n2,y,4\n' >"$(scratch)/twice.csv"
    assert_equal "$(column "$(scratch)/twice.csv" a | tr '\n' ' ')" "1 2 "
    assert_equal "$(csv_awk '{ print col("a") col("d") has("b") has("d") }' "$(scratch)/twice.csv" | tr '\n' ' ')" "110 210 "
}

@test "demo_tables.py and overlap.py refuse a CSV cut short or without rows in one line, exit 2" {
    dir="$(scratch)"
    mkdir -p "$dir/demo/02-dp2-flat.r1" "$dir/run"
    printf 'step,loss,step_ms\n1,5,10\n2,5\n' >"$dir/demo/02-dp2-flat.r1/steps.csv"
    run --separate-stderr python3 "$REPO/common/python/demo_tables.py" "$dir/demo"
    assert_equal "$status" 2
    assert_equal "$stderr" "demo_tables.py: $dir/demo/02-dp2-flat.r1/steps.csv line 3: 2 fields where the header has 3, a file cut short or not this kind of CSV (valid: the steps.csv of a make demo run)"
    echo "rank,step,micro,op,start_us,end_us" >"$dir/run/timeline.csv"
    run --separate-stderr python3 "$REPO/common/python/overlap.py" "$dir/run"
    assert_equal "$status" 2
    assert_equal "$stderr" "overlap.py: $dir/run/timeline.csv: has a header and no rows (valid: the timeline.csv of a chapter 04-06 run)"
}

@test "a shape check ignores the numbers of a quoted run but not its words" {
    dir="$(scratch)"
    # other losses and timings: still the same shape
    sed -E '/^step   100\/300/ s/loss [0-9.]+/loss 9.9999/' "$REPO/course.md" >"$dir/numbers.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/numbers.md" --only "runs/01-progress"
    assert_success
    assert_output --partial "check_quotes: 1 of 1 quoted outputs match"
    # the old header format ("batch 8 = 1 x 8"): caught
    sed 's/batch 8 = 1 micro-batches x 8 sequences/batch 8 = 1 x 8/' "$REPO/course.md" >"$dir/words.md"
    run python3 "$REPO/common/python/check_quotes.py" --file "$dir/words.md" --only "out runs/01-tiny300"
    assert_failure
    assert_output --partial "batch 8 = 1 x 8"
}

@test "common/scripts/mpirun.sh gives each rank cores/ranks threads unless told, and ends with the failing rank's status" {
    cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
    want=$((cores / 4)); ((want > 0)) || want=1
    run env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY "$REPO/common/scripts/mpirun.sh" -np 4 bash -c 'echo "$OMP_NUM_THREADS $OMP_WAIT_POLICY"'
    assert_success
    assert_equal "$(echo "$output" | sort -u)" "$want passive"
    run env OMP_NUM_THREADS=3 "$REPO/common/scripts/mpirun.sh" -np 2 bash -c 'echo "$OMP_NUM_THREADS"'
    assert_equal "$(echo "$output" | sort -u)" "3"
    # Open MPI's Omni-Path/InfiniPath layers are left out unless the learner says otherwise
    run env -u OMPI_MCA_mtl "$REPO/common/scripts/mpirun.sh" -np 2 bash -c 'echo "$OMPI_MCA_mtl"'
    assert_equal "$(echo "$output" | sort -u)" "^ofi,psm,psm2"
    run env OMPI_MCA_mtl=psm2 "$REPO/common/scripts/mpirun.sh" -np 2 bash -c 'echo "$OMPI_MCA_mtl"'
    assert_equal "$(echo "$output" | sort -u)" "psm2"
    # a refused flag: the rank's one line and its status 2, no banner from mpirun
    run "$REPO/common/scripts/mpirun.sh" -np 2 "$REPO/02_data_parallel/train" --device cpu --batch 3 --steps 1 --out "$(scratch)/x"
    assert_equal "$status" 2
    assert_output "error: --batch 3 is not divisible by 2 ranks x --micro 1 (valid: a multiple of 2)"
    run "$REPO/common/scripts/mpirun.sh" ./02_data_parallel/train
    assert_equal "$status" 2
    assert_output --partial "usage: common/scripts/mpirun.sh -np N PROGRAM"
}
