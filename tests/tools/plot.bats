#!/usr/bin/env bats
# plot.bats: common/python/plot.py on input it cannot draw, and its --out.
# Every case ends in one line on stderr naming the file and what was expected,
# exit status 2, never a Python traceback; plot.py writes only new PNGs or
# over its own earlier ones (common/python/tool.py's output-file rule).

load ../helpers

PLOT="$REPO/common/python/plot.py"

# A real run of chapter 01 (tiny, 2 steps) and of chapter 04 (2 stages), made once.
setup_file() {
    local d="$BATS_FILE_TMPDIR"
    OMP_NUM_THREADS=1 "$TRAIN01" --model tiny --batch 4 --steps 2 --sample 0 --quiet --eval-batches 1 \
        --out "$d/01" >/dev/null
    (cd "$REPO" && OMP_NUM_THREADS=1 mpirun_np 2 04_pipeline/train --model tiny --batch 4 --micro 2 --pp 2 \
        --steps 2 --sample 0 --quiet --eval-batches 1 --out "$d/04" >/dev/null)
}

setup() {
    python="$(plot_python)"
    "$python" -c "import matplotlib" 2>/dev/null || skip "no python3 with matplotlib"
}

# refused MESSAGE_REGEX: the last `run --separate-stderr` ended with exit 2 and one line on
# stderr matching MESSAGE_REGEX, no traceback.
refused() {
    assert_equal "$status" 2
    assert_equal "${#stderr_lines[@]}" 1
    if [[ "$stderr" == *Traceback* ]]; then fail "a traceback: $stderr"; fi
    assert_regex "$stderr" "$1"
}

# a copy of the 01 run, to spoil one of its files
spoilt_run() {
    rm -rf "$(scratch)/$1"
    cp -r "$BATS_FILE_TMPDIR/01" "$(scratch)/$1"
    echo "$(scratch)/$1"
}

@test "plot.py refuses an empty CSV in one line, exit 2" {
    run_dir="$(spoilt_run empty)"
    : >"$run_dir/steps.csv"
    run --separate-stderr "$python" "$PLOT" "$run_dir" --out "$(scratch)/plots"
    refused "^plot.py: $run_dir/steps.csv: is empty \(valid: a run directory written by a chapter program\)$"
}

@test "plot.py refuses a CSV with a header and no rows in one line, exit 2" {
    run_dir="$(spoilt_run header)"
    head -1 "$BATS_FILE_TMPDIR/01/memory.csv" >"$run_dir/memory.csv"
    run --separate-stderr "$python" "$PLOT" "$run_dir" --out "$(scratch)/plots"
    refused "^plot.py: $run_dir/memory.csv: has a header and no rows \(valid: .*\)$"
}

@test "plot.py refuses a CSV cut short in one line, exit 2" {
    run_dir="$(spoilt_run cut)"
    # the header and the first row cut after its third field
    { head -1 "$BATS_FILE_TMPDIR/01/steps.csv"; sed -n 2p "$BATS_FILE_TMPDIR/01/steps.csv" | cut -d, -f1-3; } \
        >"$run_dir/steps.csv"
    run --separate-stderr "$python" "$PLOT" "$run_dir" --out "$(scratch)/plots"
    refused "^plot.py: $run_dir/steps.csv line 2: 3 fields where the header has [0-9]+, a file cut short"
}

@test "plot.py refuses a field that is not a number in one line naming its file, line and column, exit 2" {
    run_dir="$(spoilt_run number)"
    # the first row's loss spoilt: 1,abc,...
    sed -i '2s/^\([^,]*\),[^,]*/\1,abc/' "$run_dir/steps.csv"
    run --separate-stderr "$python" "$PLOT" "$run_dir" --out "$(scratch)/plots"
    refused "^plot.py: $run_dir/steps.csv line 2: loss = 'abc' is not a number \(valid: .*\)$"
}

@test "plot.py refuses a binary file in one line, exit 2" {
    run_dir="$(spoilt_run binary)"
    printf '\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\1\0' >"$run_dir/run.csv"
    run --separate-stderr "$python" "$PLOT" "$run_dir" --out "$(scratch)/plots"
    refused "^plot.py: $run_dir/run.csv: is not a text CSV \(valid: .*\)$"
}

@test "plot.py --gantt refuses a run without timeline.csv in one line, exit 2" {
    run --separate-stderr "$python" "$PLOT" --gantt "$BATS_FILE_TMPDIR/01" --out "$(scratch)/plots"
    refused "^plot.py: $BATS_FILE_TMPDIR/01/timeline.csv: no such file \(valid: a run of chapter 03 with --cp or --ep, or of chapter 04, 05 or 06: they write timeline.csv\)$"
}

@test "plot.py --bubbles and --sweep refuse a run that is not a pipeline's in one line, exit 2, and draw 04's" {
    for mode in --bubbles --sweep; do
        run --separate-stderr "$python" "$PLOT" $mode "$BATS_FILE_TMPDIR/01" --out "$(scratch)/plots"
        refused "^plot.py: $BATS_FILE_TMPDIR/01/run.csv has no schedule and bubble_measured: not a pipeline run \(valid: runs of chapter 04, or 05-06 with --pp\)$"
    done
    run --separate-stderr "$python" "$PLOT" --bubbles "$BATS_FILE_TMPDIR/04" --out "$(scratch)/plots"
    assert_success
    [ -s "$(scratch)/plots/bubbles.png" ]
    # one stage: no bubble, and none replayed (nothing to divide by)
    OMP_NUM_THREADS=1 "$REPO/04_pipeline/train" --model tiny --batch 4 --steps 2 --sample 0 --quiet --eval-batches 1 \
        --out "$(scratch)/04-pp1" >/dev/null
    run --separate-stderr "$python" "$PLOT" --bubbles "$(scratch)/04-pp1" --out "$(scratch)/plots"
    assert_success
    assert_output --partial "formula 0.000, 0.000 replayed at the run's own times"$'\n'
}

@test "plot.py --zero refuses a chapter 04 run in one line, exit 2" {
    run --separate-stderr "$python" "$PLOT" --zero "$BATS_FILE_TMPDIR/04" --out "$(scratch)/plots"
    refused "^plot.py: $BATS_FILE_TMPDIR/04/run.csv: has no column '[a-z_]+' \(valid: a run of chapter 05\)$"
}

@test "plot.py --zero marks the planner's formula, and says so in one line, exit 2, where the planner is missing" {
    # the 01 run as one ZeRO stage-0 rank: plot.py's formula is common/plan --zero-table's, to its 4 digits
    local z="$(spoilt_run zero0)"
    awk -F, -v OFS=, '{ print $0, NR == 1 ? "bytes_sent_per_step" : 0 }' "$BATS_FILE_TMPDIR/01/run.csv" >"$z/run.csv"
    params="$(csv_column "$z/run.csv" params)"
    planned="$("$REPO/common/plan" --zero-table --params "$params" --gpus 1 --precision fp32 |
        awk '$1 == "baseline" { printf "%.3f", ($3 + $4 + $5) / 1048576 }')"
    [ -n "$planned" ]
    run "$python" "$PLOT" --zero "$z" --out "$(scratch)/plots"
    assert_success
    assert_line --regexp "^zero zero0: model state [0-9.]+ MiB per rank \(formula $planned\), "
    # a copy of common/python with no common/plan beside it
    mkdir -p "$(scratch)/copy/common" && cp -r "$REPO/common/python" "$(scratch)/copy/common/"
    run --separate-stderr "$python" "$(scratch)/copy/common/python/plot.py" --zero "$z" --out "$(scratch)/plots2"
    refused "^plot.py: --zero: cannot run $(scratch)/copy/common/plan for the ZeRO formula \(No such file or directory\) \(valid: the planner, built by make\)$"
    [ ! -e "$(scratch)/plots2/zero.png" ]
}

@test "plot.py --commbench, --capacity and --offload-bench refuse a steps.csv in one line, exit 2" {
    local steps="$BATS_FILE_TMPDIR/01/steps.csv"
    run --separate-stderr "$python" "$PLOT" --commbench "$steps" --out "$(scratch)/plots"
    refused "^plot.py: $steps: has no column 'op' \(valid: a CSV written by 02_data_parallel/commbench\)$"
    run --separate-stderr "$python" "$PLOT" --capacity "$steps" --out "$(scratch)/plots"
    refused "^plot.py: $steps: has no column 'program' \(valid: the capacity.csv of 06_offload/capacity.py\)$"
    run --separate-stderr "$python" "$PLOT" --offload-bench "$steps" --out "$(scratch)/plots"
    refused "^plot.py: $steps: has no column '[a-z_]+' \(valid: the offload_summary.csv of common/scripts/bench_offload.sh\)$"
    for png in busbw capacity offload; do [ ! -e "$(scratch)/plots/$png.png" ]; done
}

@test "plot.py without matplotlib says so in one line, exit 2" {
    mkdir -p "$(scratch)/no-mpl/matplotlib"
    echo 'raise ImportError("no matplotlib here (a test)")' >"$(scratch)/no-mpl/matplotlib/__init__.py"
    PYTHONPATH="$(scratch)/no-mpl" run --separate-stderr "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$(scratch)/plots"
    refused "^plot.py: this python3 cannot import matplotlib \(no matplotlib here \(a test\)\) \(valid: a python3 with matplotlib, "
    [ ! -e "$(scratch)/plots" ]
}

@test "plot.py --out refuses a file that is not a directory, and a PNG name held by a text file or a directory" {
    local out="$(scratch)/plots"
    cp "$REPO/tests/fixtures/text.txt" "$(scratch)/notes.txt"
    run --separate-stderr "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$(scratch)/notes.txt"
    refused "^plot.py: --out $(scratch)/notes.txt: exists and is not a directory \(valid: a new name or a directory\)$"
    cmp "$(scratch)/notes.txt" "$REPO/tests/fixtures/text.txt"
    mkdir -p "$out"
    cp "$REPO/tests/fixtures/text.txt" "$out/loss.png"
    run --separate-stderr "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$out"
    refused "^plot.py: --out $out/loss.png: exists and is not a PNG plot.py wrote \(valid: a new name or an earlier PNG plot.py wrote\)$"
    cmp "$out/loss.png" "$REPO/tests/fixtures/text.txt"
    rm "$out/loss.png"
    mkdir "$out/loss.png"
    run --separate-stderr "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$out"
    refused "^plot.py: --out $out/loss.png: is a directory \(valid: a file name\)$"
    # a PNG that matplotlib did not write is not plot.py's either
    rmdir "$out/loss.png"
    printf '\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\1\0\0\0\1\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\0IEND\xaeB`\x82' >"$out/loss.png"
    cp "$out/loss.png" "$(scratch)/other.png"
    run --separate-stderr "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$out"
    refused "^plot.py: --out $out/loss.png: exists and is not a PNG plot.py wrote"
    cmp "$out/loss.png" "$(scratch)/other.png"
}

@test "plot.py --out takes a new name, and again the same directory over its own earlier plots" {
    local out="$(scratch)/new/plots"
    run "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" --out "$out"
    assert_success
    cp "$out/loss.png" "$(scratch)/first-loss.png"
    run "$python" "$PLOT" "$BATS_FILE_TMPDIR/01" "$BATS_FILE_TMPDIR/04" --out "$out"
    assert_success
    assert_output "plot.py: wrote loss.png, runtime.png, throughput.png, memory.png, breakdown.png, idle.png to $out"
    # replaced: the second plot has two curves
    run cmp -s "$out/loss.png" "$(scratch)/first-loss.png"
    assert_failure
}

@test "plot.py --experts draws an MoE run's routing and prints its last step's shares from steps.csv" {
    local d="$(scratch)/moe"
    OMP_NUM_THREADS=1 "$TRAIN01" --model tiny --batch 4 --steps 3 --sample 0 --quiet --eval-batches 1 \
        --experts 3 --top-k 2 --capacity-factor 1 --out "$d" >/dev/null
    # the last step's shares, each expert's choices over all of them (dropped included)
    shares="$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /^tokens_e/) e[++n] = i; if ($i == "dropped") d = i } next }
                       { last = $0 } END { split(last, v, ","); total = v[d]; for (k = 1; k <= n; k++) total += v[e[k]]
                         for (k = 1; k <= n; k++) printf "%s%.3f", (k > 1 ? "/" : ""), v[e[k]] / total
                         printf " %.3f", v[d] / total }' "$d/steps.csv")"
    run "$python" "$PLOT" --experts "$d" --out "$(scratch)/plots"
    assert_success
    assert_line "experts moe: step 3: shares ${shares% *}, dropped ${shares#* }, aux_loss $(csv_column "$d/steps.csv" aux_loss | tail -1 | sed 's/0*$//')"
    [ -s "$(scratch)/plots/experts.png" ]
}

@test "plot.py --experts refuses a dense run in one line, exit 2" {
    run --separate-stderr "$python" "$PLOT" --experts "$BATS_FILE_TMPDIR/01" --out "$(scratch)/plots"
    refused "^plot.py: $BATS_FILE_TMPDIR/01/steps.csv: has no column 'tokens_e0' \(valid: a run of chapter 01 or 02 with --experts\)$"
    [ ! -e "$(scratch)/plots/experts.png" ]
}

@test "plot.py --ep (and --gantt) draws one step of a chapter 03 --ep run and prints its load from steps.csv" {
    local d="$(scratch)/03-ep2"
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN03" --model tiny --batch 4 --steps 3 --sample 0 --quiet --eval-batches 1 \
        --experts 4 --top-k 1 --dp 2 --ep 2 --out "$d" >/dev/null
    # the step shown (the last, or --step 2): steps.csv's ep_rows_max, ep_rows_mean and their ratio
    for step in 3 2; do
        load="$(awk -F, -v s=$step 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
                      $1 == s { printf "ep_rows_max %s, ep_rows_mean %s, max / mean %.3f", $c["ep_rows_max"],
                                $c["ep_rows_mean"], $c["ep_rows_max"] / $c["ep_rows_mean"] }' "$d/steps.csv")"
        [ -n "$load" ]
        run --separate-stderr "$python" "$PLOT" --ep "$d" $([ $step = 2 ] && echo --step 2) --out "$(scratch)/plots"
        assert_success
        assert_line "ep 03-ep2: step $step: $load"
    done
    [ -s "$(scratch)/plots/ep-03-ep2.png" ]
    run --separate-stderr "$python" "$PLOT" --gantt "$d" --out "$(scratch)/gantt"
    assert_success
    assert_line "plot.py: wrote ep-03-ep2.png to $(scratch)/gantt"
    [ -s "$(scratch)/gantt/ep-03-ep2.png" ]
}

@test "plot.py --ep refuses a run without the ep_* timeline rows in one line, exit 2" {
    run --separate-stderr "$python" "$PLOT" --ep "$BATS_FILE_TMPDIR/04" --out "$(scratch)/plots"
    refused "^plot.py: $BATS_FILE_TMPDIR/04/timeline.csv has no ep_dispatch, ep_experts or ep_combine rows in step 2 \(valid: a run of chapter 03 with --experts E --ep N\)$"
    run --separate-stderr "$python" "$PLOT" --ep "$BATS_FILE_TMPDIR/01" --out "$(scratch)/plots"
    refused "^plot.py: $BATS_FILE_TMPDIR/01/timeline.csv: no such file \(valid: a run of chapter 03 with --experts E --ep N\)$"
    [ ! -e "$(scratch)/plots/ep-04.png" ] && [ ! -e "$(scratch)/plots/ep-01.png" ]
}
