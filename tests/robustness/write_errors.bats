#!/usr/bin/env bats
# Output that is never lost silently: a write error (a full disk) ends the run
# with exit 1 naming the file and the reason; steps.csv keeps only complete
# lines, every other file appears whole or not at all, and no .tmp is left.
# A directory holding another run's files is refused unless --overwrite; a
# resume into its own run's directory appends. Paths that are not regular
# files (device nodes, FIFOs, /proc) are refused before training.
#
# Full disks are simulated with COURSE_FAULT_DISK_FULL=NAME[:BYTES] (writes to
# NAME fail with ENOSPC after BYTES); where mounting is allowed, one test uses
# a real 4 KiB tmpfs as well.

load ../helpers

setup() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

# train PROGRAM NP [FLAGS...]: run a chapter (NP 0: without mpirun) into $(scratch)/out.
train() {
    local program="$1" np="$2"
    shift 2
    if [ "$np" = 0 ]; then
        run --separate-stderr timeout 60 "$REPO/$program" --sample 0 --quiet "$@"
    else
        run --separate-stderr timeout 60 mpirun --oversubscribe -np "$np" "$REPO/$program" --sample 0 --quiet "$@"
    fi
}

# Exit 1, one error line naming $1 and the reason, no .tmp left in $2.
assert_write_failed() {
    echo "status $status; stderr: $stderr"
    assert_equal "$status" 1
    assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    [[ "$stderr" == *"$1"*"No space left on device"* ]]
    [ -z "$(find "$2" -name '*.tmp')" ]
}

# Every line of steps.csv is complete: as many fields as the header.
assert_whole_lines() {
    awk -F, 'NR == 1 { n = NF; next } NF != n { print "line " NR " is cut: " $0; bad = 1 } END { exit bad }' "$1"
    [ "$(tail -c 1 "$1" | od -An -c | tr -d ' ')" = '\n' ]
}

@test "01: a disk that fills while writing steps.csv ends the run with exit 1, keeping whole lines" {
    COURSE_FAULT_DISK_FULL=steps.csv:700 train 01_single_gpu/train 0 --steps 20 --out "$(scratch)/out"
    assert_write_failed "steps.csv" "$(scratch)/out"
    assert_whole_lines "$(scratch)/out/steps.csv"
    [ ! -e "$(scratch)/out/run.csv" ]
    grep -q '^status running' "$(scratch)/out/run-info.txt"
}

@test "02, 03, 04: a disk that fills while writing steps.csv ends the job with exit 1" {
    for program in 02_data_parallel/train 03_model_parallel/train 04_pipeline/train; do
        rm -rf "$(scratch)/out"
        COURSE_FAULT_DISK_FULL=steps.csv:500 train "$program" 2 --steps 20 --out "$(scratch)/out"
        assert_write_failed "steps.csv" "$(scratch)/out"
        assert_whole_lines "$(scratch)/out/steps.csv"
    done
}

@test "a failed write of memory.csv or run.csv leaves neither half a file nor a .tmp" {
    for name in memory.csv run.csv run-info.txt; do
        rm -rf "$(scratch)/out"
        COURSE_FAULT_DISK_FULL=$name:40 train 01_single_gpu/train 0 --steps 2 --out "$(scratch)/out"
        assert_write_failed "$name" "$(scratch)/out"
        [ ! -e "$(scratch)/out/$name" ] || [ "$name" = run-info.txt ]
    done
}

@test "04: a failed write of timeline.csv or trace.json leaves no half file" {
    for name in timeline.csv trace.json; do
        rm -rf "$(scratch)/out"
        COURSE_FAULT_DISK_FULL=$name:100 train 04_pipeline/train 2 --steps 2 --out "$(scratch)/out"
        assert_write_failed "$name" "$(scratch)/out"
        [ ! -e "$(scratch)/out/$name" ]
    done
}

@test "commbench: a failed write of its CSV ends with exit 1 and leaves nothing" {
    COURSE_FAULT_DISK_FULL=bench.csv:100 run --separate-stderr timeout 60 mpirun --oversubscribe -np 2 \
        "$REPO/02_data_parallel/commbench" --max-bytes 64K --out "$(scratch)/bench.csv"
    assert_write_failed "bench.csv" "$(scratch)"
    [ ! -e "$(scratch)/bench.csv" ]
}

@test "a real full filesystem (a 4 KiB tmpfs) ends the run with exit 1 naming ENOSPC" {
    mkdir -p "$(scratch)/small"
    mount -t tmpfs -o size=4k tmpfs "$(scratch)/small" 2>/dev/null || skip "mounting a tmpfs is not allowed here"
    train 01_single_gpu/train 0 --steps 100 --out "$(scratch)/small/out"
    local status_was=$status stderr_was=$stderr
    cp -r "$(scratch)/small/out" "$(scratch)/copy" || true
    umount "$(scratch)/small"
    status=$status_was stderr=$stderr_was
    assert_write_failed "" "$(scratch)/copy"
    [[ "$stderr" == *"--out $(scratch)/small/out"* ]]
}

# ---- checkpoints ----

@test "a save that fails part-way ends with exit 1 and leaves no checkpoint and no .tmp" {
    COURSE_FAULT_DISK_FULL=ck:5000 train 01_single_gpu/train 0 --steps 2 --save "$(scratch)/ck" --out "$(scratch)/out"
    assert_write_failed "--save $(scratch)/ck: write failed" "$(scratch)"
    [ ! -e "$(scratch)/ck" ]
}

@test "--save /dev/full is refused before training and leaves the device alone" {
    train 01_single_gpu/train 0 --steps 2 --save /dev/full --out "$(scratch)/out"
    assert_equal "$status" 2
    [[ "$stderr" == *"--save /dev/full: not a regular file"* ]]
    [ -c /dev/full ]
    [ ! -e "$(scratch)/out/steps.csv" ]
}

@test "--save into a missing directory is refused before training" {
    train 01_single_gpu/train 0 --steps 2 --save "$(scratch)/nowhere/ck" --out "$(scratch)/out"
    assert_equal "$status" 2
    [[ "$stderr" == *"the directory $(scratch)/nowhere does not exist"* ]]
    [ ! -e "$(scratch)/out/steps.csv" ]
}

@test "--data, --resume and --out refuse device nodes, FIFOs and /proc files" {
    mkfifo "$(scratch)/fifo"
    for data in /dev/zero /proc/cpuinfo "$(scratch)/fifo"; do
        train 01_single_gpu/train 0 --steps 1 --data "$data" --out "$(scratch)/out"
        assert_equal "$status" 2
        [[ "$stderr" == *"--data $data: not a regular file"* ]]
    done
    for resume in /dev/zero "$(scratch)/fifo"; do
        train 01_single_gpu/train 0 --steps 1 --resume "$resume" --out "$(scratch)/out"
        assert_equal "$status" 2
        [[ "$stderr" == *"--resume $resume: not a regular file"* ]]
    done
    train 01_single_gpu/train 0 --steps 1 --out /dev/null
    assert_equal "$status" 2
    [[ "$stderr" == *"--out /dev/null: exists and is not a directory"* ]]
}

# ---- reusing an output directory ----

@test "a new run into another run's directory is refused, naming its files" {
    train 01_single_gpu/train 0 --steps 2 --out "$(scratch)/out"
    assert_success
    train 01_single_gpu/train 0 --steps 3 --out "$(scratch)/out"
    assert_equal "$status" 2
    [[ "$stderr" == *"--out $(scratch)/out holds another run's files (run-info.txt, steps.csv, run.csv, memory.csv"* ]]
    [[ "$stderr" == *"--overwrite"* ]]
    assert_equal "$(csv_column "$(scratch)/out/steps.csv" step | tr '\n' ' ')" "1 2 "
}

@test "the same program with the same flags replaces its own earlier run" {
    train 01_single_gpu/train 0 --steps 2 --out "$(scratch)/out"
    train 01_single_gpu/train 0 --steps 2 --out "$(scratch)/out"
    assert_success
    assert_equal "$(csv_column "$(scratch)/out/steps.csv" step | tr '\n' ' ')" "1 2 "
}

@test "02 writing into a 04 directory is refused, and --overwrite removes the old timeline" {
    train 04_pipeline/train 2 --steps 2 --out "$(scratch)/out"
    assert_success
    [ -e "$(scratch)/out/timeline.csv" ]
    train 02_data_parallel/train 2 --steps 2 --out "$(scratch)/out"
    assert_equal "$status" 2
    [[ "$stderr" == *"written by 04_pipeline/train"* ]]
    train 02_data_parallel/train 2 --steps 2 --out "$(scratch)/out" --overwrite
    assert_success
    [ ! -e "$(scratch)/out/timeline.csv" ] && [ ! -e "$(scratch)/out/trace.json" ]
    grep -q '^program 02_data_parallel/train' "$(scratch)/out/run-info.txt"
    grep -q '^status complete' "$(scratch)/out/run-info.txt"
}

@test "a failed run's leftovers never mix with a new run: the next run replaces all of them" {
    train 01_single_gpu/train 0 --steps 3 --out "$(scratch)/out"
    COURSE_FAULT_DISK_FULL=memory.csv train 01_single_gpu/train 0 --steps 4 --out "$(scratch)/out" --overwrite
    assert_equal "$status" 1
    # whatever is there is the failed run's, marked as not complete; nothing of the 3-step run
    grep -q '^status running' "$(scratch)/out/run-info.txt"
    assert_equal "$(csv_column "$(scratch)/out/steps.csv" step | tr '\n' ' ')" "1 2 3 4 "
    assert_equal "$(csv_column "$(scratch)/out/run.csv" steps)" 4
    [ ! -e "$(scratch)/out/memory.csv" ]
}

@test "a replaced run takes its flight recorder files with it, and --save refuses their names" {
    train 02_data_parallel/train 2 --steps 2 --out "$(scratch)/out"
    assert_success
    # as a watchdog that fired would have left them (watchdog.h)
    echo "# flight recorder of rank 1" >"$(scratch)/out/flight-1.txt"
    echo "notes" >"$(scratch)/out/flight-notes.txt"
    train 02_data_parallel/train 2 --steps 2 --out "$(scratch)/out" --save "$(scratch)/out/flight-1.txt"
    assert_equal "$status" 2
    [[ "$stderr" == *"--save $(scratch)/out/flight-1.txt: is flight-1.txt, a file this run writes into --out"* ]]
    train 02_data_parallel/train 2 --steps 2 --out "$(scratch)/out" --overwrite
    assert_success
    [ ! -e "$(scratch)/out/flight-1.txt" ]
    [ -e "$(scratch)/out/flight-notes.txt" ] # not a rank's file: not the run's
}

@test "resuming into its own run's directory appends to steps.csv" {
    train 01_single_gpu/train 0 --steps 6 --stop-after 3 --save "$(scratch)/ck" --out "$(scratch)/out"
    assert_success
    train 01_single_gpu/train 0 --steps 6 --resume "$(scratch)/ck" --out "$(scratch)/out"
    assert_success
    assert_equal "$(csv_column "$(scratch)/out/steps.csv" step | tr '\n' ' ')" "1 2 3 4 5 6 "
    grep -q '^status complete' "$(scratch)/out/run-info.txt"
    train 01_single_gpu/train 0 --steps 6 --out "$(scratch)/ref"
    assert_losses_match "$(scratch)/ref" "$(scratch)/out" 6
}
