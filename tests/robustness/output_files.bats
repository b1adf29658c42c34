#!/usr/bin/env bats
# output_files.bats: the output-file rule (common/core/util.h's output_file_check, common/scripts/outputs.sh
# for the scripts). Every tool that writes a file it is told to write replaces only a new name or its
# own earlier output, known by content; it refuses a text file, a checkpoint, the training text, a
# directory, in one line with exit status 2, and changes none of them. One test per tool.

load ../helpers

export OMP_NUM_THREADS=1
PLAN="$REPO/common/plan"
CKPT="$REPO/common/ckpt"
MACHINE="$REPO/common/machines/h100-sxm.machine"

# A checkpoint and a copy of the training text, made once for the file.
setup_file() {
    cp "$REPO/tests/fixtures/text.txt" "$BATS_FILE_TMPDIR/corpus.txt"
    "$REPO/01_single_gpu/train" --device cpu --model tiny --steps 1 --sample 0 --quiet \
        --data "$BATS_FILE_TMPDIR/corpus.txt" --save "$BATS_FILE_TMPDIR/ck" --out "$BATS_FILE_TMPDIR/run" >/dev/null
}

# victims: in the test's directory, notes.txt (text), ck (a checkpoint), corpus.txt (the --data
# file of the runs) and an empty directory dir; their sums, to compare after.
victims() {
    local d="$BATS_TEST_TMPDIR"
    printf 'a learner'"'"'s notes\nsecond line\n' >"$d/notes.txt"
    cp "$BATS_FILE_TMPDIR/ck" "$d/ck"
    cp "$BATS_FILE_TMPDIR/corpus.txt" "$d/corpus.txt"
    mkdir -p "$d/dir"
    mkdir -p "$d/originals"
    cp "$d/notes.txt" "$d/ck" "$d/corpus.txt" "$d/originals/"
}

# refused FILE WORDS COMMAND...: COMMAND exits 2 with one line on stderr that names FILE and contains
# WORDS, and FILE is as it was (byte for byte; a directory stays empty).
refused() {
    local file="$1" words="$2"
    shift 2
    if declare -F "$1" >/dev/null; then # a function of this file (timeout runs programs only)
        run --separate-stderr "$@"
    else
        run --separate-stderr timeout 60 "$@"
    fi
    [ "$status" = 2 ] || { echo "status $status: $stderr"; false; }
    assert_equal "$(grep -c . <<<"$stderr")" 1
    [[ "$stderr" == *"$file"*"$words"* ]] || { echo "stderr: $stderr"; false; }
    if [ -d "$file" ]; then
        [ -z "$(ls -A "$file")" ] || { echo "left in $file:"; ls -A "$file"; false; }
    else
        cmp "$file" "$BATS_TEST_TMPDIR/originals/$(basename "$file")"
    fi
}

# refuses_all FLAG_WORDS COMMAND_BEFORE_PATH... -- COMMAND_AFTER_PATH...: the command with each victim
# as the path, refused and unchanged.
refuses_all() {
    local d="$BATS_TEST_TMPDIR" before=() after=() seen=0 word
    for word in "$@"; do
        if [ "$word" = -- ]; then seen=1; elif [ $seen = 0 ]; then before+=("$word"); else after+=("$word"); fi
    done
    refused "$d/notes.txt" ": exists and is not" "${before[@]}" "$d/notes.txt" "${after[@]}"
    refused "$d/ck" ": exists and is not" "${before[@]}" "$d/ck" "${after[@]}"
    refused "$d/corpus.txt" ": exists and is not" "${before[@]}" "$d/corpus.txt" "${after[@]}"
    refused "$d/dir" ": is a directory (valid: a file name)" "${before[@]}" "$d/dir" "${after[@]}"
}

@test "common/ckpt export replaces only a new name or its own earlier export, as --save does" {
    victims
    local d="$BATS_TEST_TMPDIR"
    refuses_all "$CKPT" export "$BATS_FILE_TMPDIR/ck" --
    run --separate-stderr "$CKPT" export "$d/ck" "$d/notes.txt"
    assert_equal "$stderr" "error: export $d/notes.txt: exists and is not a safetensors export of common/ckpt (valid: a new name or an earlier export)"
    "$CKPT" export "$d/ck" "$d/model.safetensors" >/dev/null
    cp "$d/model.safetensors" "$d/first"
    run "$CKPT" export "$d/ck" "$d/model.safetensors" --optimizer
    assert_success
    # the second export replaced the first (it holds Adam's moments too)
    [ "$(stat -c %s "$d/model.safetensors")" -gt "$(stat -c %s "$d/first")" ]
}

@test "common/plan --csv replaces only a new name or its own earlier CSV, the --data file never" {
    victims
    local d="$BATS_TEST_TMPDIR"
    refuses_all "$PLAN" --model tiny --data "$d/corpus.txt" --csv --
    run --separate-stderr "$PLAN" --model tiny --csv "$d/notes.txt"
    assert_equal "$stderr" "error: --csv $d/notes.txt: exists and is not a CSV of common/plan --csv (header rank,space,category,peak_bytes) (valid: a new name or an earlier --csv file)"
    # the refusal comes before the plan: nothing printed
    assert_equal "$output" ""
    "$PLAN" --model tiny --csv "$d/memory.csv" >/dev/null
    run "$PLAN" --model tiny --dp 2 --csv "$d/memory.csv"
    assert_success
    assert_equal "$(head -1 "$d/memory.csv")" "rank,space,category,peak_bytes"
    assert_equal "$(cut -d, -f1 "$d/memory.csv" | sort -u | tr '\n' ' ')" "0 1 rank " # rewritten for 2 ranks
    # a run's memory.csv has the same header, but it is the run's, beside its run-info.txt
    cp -r "$BATS_FILE_TMPDIR/run" "$d/run"
    cp "$d/run/memory.csv" "$d/originals/memory.csv"
    refused "$d/run/memory.csv" "is a run's memory.csv in its --out directory $d/run" \
        "$PLAN" --model tiny --csv "$d/run/memory.csv"
    "$PLAN" --model tiny --csv "$d/run/plan.csv" >/dev/null # another name beside the run is the plan's
}

@test "common/plan --time-csv replaces only a new name or its own earlier CSV" {
    victims
    local d="$BATS_TEST_TMPDIR"
    refuses_all "$PLAN" --model tiny --machine "$MACHINE" --data "$d/corpus.txt" --time-csv --
    "$PLAN" --model tiny --csv "$d/memory.csv" >/dev/null # another of plan's CSVs is not a --time-csv
    cp "$d/memory.csv" "$d/originals/memory.csv"
    refused "$d/memory.csv" "exists and is not a CSV of common/plan --time-csv (header part,busy_ms,exposed_ms)" \
        "$PLAN" --model tiny --machine "$MACHINE" --time-csv "$d/memory.csv"
    "$PLAN" --model tiny --machine "$MACHINE" --time-csv "$d/time.csv" >/dev/null
    run "$PLAN" --model tiny --machine "$MACHINE" --time-csv "$d/time.csv"
    assert_success
    assert_equal "$(head -1 "$d/time.csv")" "part,busy_ms,exposed_ms"
}

@test "common/plan --calibrate and calibrate.sh replace only a new name or a machine file they wrote, and refuse a directory up front" {
    victims
    local d="$BATS_TEST_TMPDIR"
    refuses_all "$PLAN" --quick --calibrate --
    run --separate-stderr "$PLAN" --calibrate "$d/dir" --quick
    assert_equal "$stderr" "error: --calibrate $d/dir: is a directory (valid: a file name)"
    refuses_all "$REPO/common/scripts/calibrate.sh" -- --quick
    # a shipped machine file was not written by calibrate.sh
    cp "$MACHINE" "$d/originals/h100.machine"
    cp "$MACHINE" "$d/h100.machine"
    refused "$d/h100.machine" "exists and is not a machine file of common/plan --calibrate" \
        "$PLAN" --calibrate "$d/h100.machine" --quick
    # a new name, then the file it wrote, measured again
    run timeout 120 "$PLAN" --calibrate "$d/here.machine" --quick --device cpu
    assert_success
    sed -i 's/^name = .*/name = before/' "$d/here.machine"
    run timeout 120 "$PLAN" --calibrate "$d/here.machine" --quick --device cpu
    assert_success
    grep -q "^name = calibrated-" "$d/here.machine"
}

@test "commbench --out replaces only a new name or its own earlier table" {
    victims
    local d="$BATS_TEST_TMPDIR"
    # one rank (mpirun's own report of a failed job would follow the line otherwise)
    refuses_all "$REPO/02_data_parallel/commbench" --max-bytes 4K --out --
    mpirun_np 2 "$REPO/02_data_parallel/commbench" --max-bytes 4K --out "$d/comm.csv" >/dev/null
    run mpirun_np 2 "$REPO/02_data_parallel/commbench" --max-bytes 1K --out "$d/comm.csv"
    assert_success
    assert_equal "$(head -1 "$d/comm.csv")" "op,ranks,transport,size_bytes,count,time_us,algbw_GBps,busbw_GBps"
    [ "$(grep -c '^allreduce,' "$d/comm.csv")" = 1 ] # rewritten: 1 KiB only
}

@test "adambench --out DIR replaces only a new or its own earlier DIR/adambench.csv" {
    victims
    local d="$BATS_TEST_TMPDIR" f
    for f in notes.txt ck corpus.txt; do
        mkdir -p "$d/out-$f"
        cp "$d/$f" "$d/out-$f/adambench.csv"
        cp "$d/$f" "$d/originals/adambench.csv"
        refused "$d/out-$f/adambench.csv" "exists and is not a table of adambench" \
            "$REPO/06_offload/adambench" --n 1K --reps 1 --out "$d/out-$f"
    done
    mkdir -p "$d/out-dir/adambench.csv"
    refused "$d/out-dir/adambench.csv" "is a directory" "$REPO/06_offload/adambench" --n 1K --reps 1 --out "$d/out-dir"
    refused "$d/notes.txt" "exists and is not a directory" "$REPO/06_offload/adambench" --n 1K --reps 1 --out "$d/notes.txt"
    "$REPO/06_offload/adambench" --n 1K --reps 1 --half none --out "$d/new" >/dev/null
    run "$REPO/06_offload/adambench" --n 1K --reps 1 --half none --out "$d/new"
    assert_success
    assert_equal "$(head -c 16 "$d/new/adambench.csv")" "kernel,path,half"
}

# ---- the shell scripts: each checks its outputs before it runs anything ----

@test "outputs.sh: a new name or a file whose first line is the script's own; a directory of its own or an empty one" {
    victims
    local d="$BATS_TEST_TMPDIR"
    check() { bash -c '. "$1"; shift; "$@"' _ "$REPO/common/scripts/outputs.sh" "$@"; }
    run check output_file_check --x "$d/new.csv" "a CSV of x" "--x file" "a,b"
    assert_success
    echo "a,b" >"$d/own.csv"
    run check output_file_check --x "$d/own.csv" "a CSV of x" "--x file" "a,b"
    assert_success
    for f in notes.txt ck corpus.txt; do
        refused "$d/$f" ": exists and is not a CSV of x (valid: a new name or an earlier --x file)" \
            check output_file_check --x "$d/$f" "a CSV of x" "--x file" "a,b"
    done
    refused "$d/dir" ": is a directory (valid: a file name)" check output_file_check --x "$d/dir" "a CSV of x" "--x file" "a,b"
    ln -s /dev/null "$d/null"
    run --separate-stderr check output_file_check --x "$d/null" "a CSV of x" "--x file" "a,b"
    assert_equal "$status" 2
    assert_equal "$stderr" "--x $d/null: not a regular file (valid: a new name or an earlier --x file)"
    run check output_dir_check --x "$d/dir" x.sh own.csv "a,b"
    assert_success
    mkdir "$d/mine" && echo "a,b" >"$d/mine/own.csv" && echo 1 >"$d/mine/other"
    run check output_dir_check --x "$d/mine" x.sh own.csv "a,b"
    assert_success
    mkdir "$d/theirs" && cp "$d/notes.txt" "$d/theirs/"
    run --separate-stderr check output_dir_check --x "$d/theirs" x.sh own.csv "a,b"
    assert_equal "$status" 2
    assert_equal "$stderr" "--x $d/theirs: exists and is not x.sh's output (no own.csv of its own; valid: a new name, an empty directory or an earlier output of x.sh)"
    cmp "$d/theirs/notes.txt" "$d/notes.txt"
}

# script_refuses VARIABLE SCRIPT [VAR=VALUE...]: SCRIPT with VARIABLE naming a directory that holds a
# learner's notes, then a text file: refused before anything runs, nothing changed or added.
script_refuses() {
    local variable="$1" script="$2" d="$BATS_TEST_TMPDIR"
    shift 2
    mkdir -p "$d/theirs" && cp "$d/notes.txt" "$d/theirs/notes.txt"
    cp "$d/notes.txt" "$d/originals/notes.txt"
    run --separate-stderr timeout 20 env "$@" "$variable=$d/theirs" "$script"
    [ "$status" = 2 ] || { echo "status $status: $stderr"; false; }
    assert_equal "$(grep -c . <<<"$stderr")" 1
    [[ "$stderr" == "$variable $d/theirs: exists and is not "* ]] || { echo "stderr: $stderr"; false; }
    assert_equal "$(ls -A "$d/theirs")" "notes.txt"
    cmp "$d/theirs/notes.txt" "$d/notes.txt"
    refused "$d/notes.txt" ": exists and is not a directory" env "$@" "$variable=$d/notes.txt" "$script"
}

@test "bench.sh replaces BENCH_OUT only when it is new, empty or an earlier bench's" {
    victims
    script_refuses BENCH_OUT "$REPO/common/scripts/bench.sh" PYTHON=false
}

@test "bench_zero.sh and bench_offload.sh write their CSVs into BENCH_OUT only over their own" {
    victims
    local d="$BATS_TEST_TMPDIR" f
    for f in notes.txt ck corpus.txt; do
        mkdir -p "$d/z-$f" "$d/o-$f"
        cp "$d/$f" "$d/z-$f/zero.csv"
        cp "$d/$f" "$d/o-$f/offload_summary.csv"
        cp "$d/$f" "$d/originals/zero.csv"
        cp "$d/$f" "$d/originals/offload_summary.csv"
        refused "$d/z-$f/zero.csv" ": exists and is not bench_zero.sh's zero.csv" \
            env BENCH_OUT="$d/z-$f" "$REPO/common/scripts/bench_zero.sh"
        refused "$d/o-$f/offload_summary.csv" ": exists and is not bench_offload.sh's offload_summary.csv" \
            env BENCH_OUT="$d/o-$f" "$REPO/common/scripts/bench_offload.sh"
    done
    mkdir -p "$d/zdir/zero.csv"
    refused "$d/zdir/zero.csv" ": is a directory" env BENCH_OUT="$d/zdir" "$REPO/common/scripts/bench_zero.sh"
    # its own earlier table is accepted: the run goes on (here to a setting it refuses)
    mkdir -p "$d/mine"
    echo "device,precision,model,ranks,settings,config,repeat,median_step_ms,median_comm_ms,median_comm_busy_ms,bytes_sent_per_step" >"$d/mine/zero.csv"
    run --separate-stderr env BENCH_OUT="$d/mine" BENCH_SETTINGS=bogus "$REPO/common/scripts/bench_zero.sh"
    assert_equal "$status" 2
    [[ "$stderr" == "bench_zero: unknown setting 'bogus' (valid: recommended, default)" ]]
}

@test "bubble_bench.sh, plan_band.sh and gpu_check.sh write into their directory only when it is new, empty or their own" {
    victims
    script_refuses BUBBLE_OUT "$REPO/common/scripts/bubble_bench.sh"
    script_refuses BAND_OUT "$REPO/common/scripts/plan_band.sh"
    script_refuses GPU_CHECK_WORK "$REPO/common/scripts/gpu_check.sh" GPU_CHECK_DEVICE=cpu
}

@test "profile_kernels.sh writes LABEL.kernels.csv and LABEL.ncu.csv only as new names or over an earlier profile" {
    victims
    local d="$BATS_TEST_TMPDIR" f
    for f in notes.txt ck corpus.txt; do
        mkdir -p "$d/p-$f"
        cp "$d/$f" "$d/p-$f/step.kernels.csv"
        cp "$d/$f" "$d/originals/step.kernels.csv"
        refused "$d/p-$f/step.kernels.csv" ": exists and is not profile_kernels.sh's step.kernels.csv" \
            "$REPO/common/scripts/profile_kernels.sh" step "$d/p-$f"
        mkdir -p "$d/q-$f"
        cp "$d/$f" "$d/q-$f/step.ncu.csv"
        cp "$d/$f" "$d/originals/step.ncu.csv"
        refused "$d/q-$f/step.ncu.csv" ": exists and is not an earlier profile's" \
            "$REPO/common/scripts/profile_kernels.sh" step "$d/q-$f"
    done
    mkdir -p "$d/r/step.ncu.csv"
    refused "$d/r/step.ncu.csv" ": is a directory" "$REPO/common/scripts/profile_kernels.sh" step "$d/r"
    # an earlier profile's pair is accepted: the script goes on (here, without ncu, to its one-line stop)
    mkdir -p "$d/mine"
    echo "label,category,kernel,calls,time_us" >"$d/mine/step.kernels.csv"
    echo "==PROF== ncu's own line" >"$d/mine/step.ncu.csv"
    if ! command -v ncu >/dev/null; then
        run --separate-stderr "$REPO/common/scripts/profile_kernels.sh" step "$d/mine"
        assert_equal "$status" 1
        assert_equal "$stderr" "profile_kernels: ncu (Nsight Compute) is not on PATH"
    fi
}
