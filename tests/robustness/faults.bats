#!/usr/bin/env bats
# Fault injection: a rank killed (SIGKILL, as a crashed machine) at a chosen
# point ends the whole job quickly, with a nonzero status and the rank named;
# a crash while saving leaves the previous checkpoint intact; and a long run
# saved and resumed every 50 steps gives the uninterrupted run's losses.
# The points are fault_point() calls (common/core/util.h), armed by
# COURSE_FAULT_KILL=NAME:RANK[:N]. Then the watchdog (common/comm/watchdog.h): a
# frozen rank (SIGSTOP) or a skipped collective is named, SIGUSR1 shows the
# flight recorder; and Ctrl-C or kill ends a run with its step, its last
# checkpoint and no temporary file left.

load ../helpers


# Tiny model, a global batch of 12 (divisible by 2, 3, 4 ranks); a private copy
# of the corpus, so that editing course.md meanwhile changes nothing.
FLAGS="--device cpu --batch 12 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"
export OMP_NUM_THREADS=1
export -f mpirun_np

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
}

# job FAULT NP PROGRAM ARGS...: mpirun_np under `timeout 20`, with
# COURSE_FAULT_KILL=FAULT (no fault when empty). Sets status, output (stdout
# and stderr) and seconds (the job's wall time).
job() {
    local fault="$1" start="$EPOCHREALTIME"
    shift
    run env COURSE_FAULT_KILL="$fault" timeout 20 bash -c 'mpirun_np "$@"' job "$@"
    seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
}

# assert_killed RANK CLEAN_SECONDS: the last job failed on its own (not ended by
# the timeout), and Open MPI named RANK as killed by signal 9. The kill comes
# before the end of the same run without the fault (CLEAN_SECONDS, start-up
# included), so the job ending within CLEAN_SECONDS + 5 s means within 5 s of
# the kill.
assert_killed() {
    local rank="$1" clean="$2"
    assert_failure
    [ "$status" -ne 124 ] || fail "the job hung until timeout 20 ended it"
    awk -v s="$seconds" -v c="$clean" 'BEGIN { exit !(s < c + 5) }' ||
        fail "the killed job took ${seconds}s, the same run without the fault ${clean}s"
    # Open MPI 4: "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
    assert_output --regexp "process rank $rank with PID [0-9]+ on node .* exited on signal 9"
}

# kill_check FAULT RANK NP PROGRAM ARGS...: the run succeeds without the fault;
# with it, the job ends within 5 s of the kill, naming RANK, and unfinished.
kill_check() {
    local fault="$1" rank="$2"
    shift 2
    job "" "$@" --out "$BATS_TEST_TMPDIR/clean"
    assert_success
    local clean="$seconds"
    job "$fault" "$@" --out "$BATS_TEST_TMPDIR/killed"
    assert_killed "$rank" "$clean"
    [ ! -e "$BATS_TEST_TMPDIR/killed/run.csv" ] || fail "the killed job wrote run.csv as if it had finished"
}

# step_losses STEPS_CSV...: "step,loss" lines of the files, one after the other.
step_losses() {
    local f
    for f in "$@"; do paste -d, <(csv_column "$f" step) <(csv_column "$f" loss); done
}

# assert_same_losses REF RUN: two lists of step_losses lines name the same
# steps in the same order, each loss within 1e-4 (relative) of the reference's.
assert_same_losses() {
    assert_equal "$(echo "$2" | wc -l)" "$(echo "$1" | wc -l)"
    paste -d, <(echo "$1") <(echo "$2") |
        awk -F, '$2 == "" || $4 == "" { print "line " NR ": no loss: " $0; bad = 1; next }
                 $1 != $3 { print "line " NR ": step " $1 " against step " $3; bad = 1; next }
                 { r = ($2 - $4) / $2; if (r < 0) r = -r; if (r > 1e-4) { print "step " $1 ": " $2 " against " $4; bad = 1 } }
                 END { exit bad }'
}

@test "a rank killed inside the library all-reduce ends the data-parallel job within 5 s, naming the rank" {
    kill_check allreduce:1 1 2 "$TRAIN02" $FLAGS --steps 5 --allreduce library
}

@test "a rank killed mid-ring ends the data-parallel job within 5 s, naming the rank" {
    kill_check ring:1 1 4 "$TRAIN02" $FLAGS --steps 5 --allreduce ring
}

@test "the last rank killed mid-ring ends the data-parallel job within 5 s, naming it" {
    kill_check ring:3 3 4 "$TRAIN02" $FLAGS --steps 5 --allreduce ring
}

@test "NAME:RANK:N kills at the N-th time: rank 1 in step 3's all-reduce, after 2 logged steps" {
    kill_check allreduce:1:3 1 2 "$TRAIN02" $FLAGS --steps 5
    assert_equal "$(csv_column "$BATS_TEST_TMPDIR/killed/steps.csv" step | tr '\n' ' ')" "1 2 "
}

@test "a pipeline stage killed in a send ends the 3-stage job within 5 s, naming the rank" {
    kill_check send:1 1 3 "$TRAIN04" $FLAGS --layers 4 --steps 4 --batch 8
}

@test "the last pipeline stage killed in a receive ends the 4-stage job within 5 s, naming it" {
    kill_check recv:3 3 4 "$TRAIN04" $FLAGS --layers 4 --steps 4 --batch 8
}

@test "a pipeline stage killed in a 1F1B send-receive ends the 4-stage job within 5 s, naming the rank" {
    kill_check sendrecv:1 1 4 "$TRAIN04" $FLAGS --layers 4 --steps 4 --batch 8 --micro 4 --schedule 1f1b
}

@test "a tensor-parallel rank killed inside its all-reduce ends the model-parallel job within 5 s, naming the rank" {
    kill_check allreduce:1 1 2 "$TRAIN03" $FLAGS --steps 4 --mp tensor
}

@test "a rank killed in ZeRO-1's parameter all-gather ends the job within 5 s, naming the rank" {
    kill_check allgather:1:2 1 2 "$TRAIN05" $FLAGS --steps 4 --zero 1
}

@test "a rank killed in ZeRO-2's gradient reduce-scatter ends the job within 5 s, naming the rank" {
    kill_check reduce_scatter:1:3 1 2 "$TRAIN05" $FLAGS --steps 4 --zero 2
}

@test "a rank killed in ZeRO-3's prefetching communication thread ends the job within 5 s, naming the rank" {
    kill_check worker:1:5 1 2 "$TRAIN05" $FLAGS --steps 4 --zero 3 --prefetch 1
}

@test "a rank killed in its small host all-reduce (the step's slowest times) ends the ZeRO-3 job, naming it" {
    kill_check host_allreduce:0:3 0 2 "$TRAIN05" $FLAGS --steps 4 --zero 3
}

@test "a rank killed in the offloaded gradients' reduce-scatter ends the chapter 06 job within 5 s, naming it" {
    kill_check reduce_scatter:1:2 1 2 "$TRAIN06" $FLAGS --steps 4 --offload
}

@test "a rank killed in the combined pp 2 x dp 2 ZeRO-2 offload job's all-gather ends it within 5 s, naming it" {
    kill_check allgather:3:2 3 4 "$TRAIN06" $FLAGS --steps 3 --batch 8 --layers 4 --pp 2 --dp 2 --zero 2 --offload
}

@test "a context-parallel rank killed at its 5th send (the ring's posted sends) ends the --cp 4 job, naming it" {
    kill_check send:0:5 0 4 "$TRAIN03" $FLAGS --steps 3 --batch 8 --cp 4 --cp-send posted
}

# Tiny runs for the hooks under ZeRO over tensor or pipeline parallelism.
SMALL="--layers 2 --dmodel 32 --heads 2 --seq 16 --batch 8 --steps 2"

# kill_each RANK POINTS -- PROGRAM ARGS...: one run without a fault for the
# time bound, then for each point of the space-separated POINTS a run with
# RANK killed at it: each ends within 5 s of the kill, naming RANK.
kill_each() {
    local rank="$1" points="$2" point clean
    shift 3
    job "" 4 "$@" --out "$BATS_TEST_TMPDIR/clean"
    assert_success
    clean="$seconds"
    for point in $points; do
        job "$point:$rank" 4 "$@" --out "$BATS_TEST_TMPDIR/$point"
        assert_killed "$rank" "$clean"
        [ ! -e "$BATS_TEST_TMPDIR/$point/run.csv" ] || fail "killed at $point, the job wrote run.csv as if it had finished"
    done
}

@test "ZeRO-1 over --pp 2 --dp 2 (1F1B): a rank killed in send, recv, sendrecv, reduce_scatter or allgather ends the job, naming it" {
    kill_each 1 "send recv sendrecv reduce_scatter allgather" -- "$TRAIN05" $FLAGS $SMALL --zero 1 --pp 2 --dp 2 \
        --micro 2 --schedule 1f1b
}

@test "ZeRO-2 over --tp 2 --dp 2: a rank killed in allreduce, reduce_scatter or allgather ends the job, naming it" {
    kill_each 2 "allreduce reduce_scatter allgather" -- "$TRAIN05" $FLAGS $SMALL --zero 2 --tp 2 --dp 2
}

@test "05 without ZeRO over --tp 2 --dp 2 (ZeRO 1-2 broadcast nothing): a rank killed in the weights' broadcast ends the job, naming it" {
    kill_each 3 broadcast -- "$TRAIN05" $FLAGS $SMALL --zero 0 --tp 2 --dp 2
}

@test "COURSE_FAULT_OVERFLOW_STEP skips 01's step on every rank under ZeRO 1 and 2 over --dp 4, --tp 2 --dp 2 and --pp 2 --dp 2" {
    local d="$BATS_TEST_TMPDIR" f="$FLAGS $SMALL --steps 3 --precision fp16 --eval-batches 1" z layout name
    COURSE_FAULT_OVERFLOW_STEP=2 run "$TRAIN01" $f --out "$d/ref"
    assert_success
    local skipped
    skipped="$(csv_column "$d/ref/steps.csv" skipped | tr '\n' ' ')"
    assert_equal "$skipped" "0 1 0 "
    for z in 1 2; do
        for layout in "--dp 4" "--tp 2 --dp 2" "--pp 2 --dp 2"; do
            name="z$z${layout//[ -]/}"
            # every rank overflows at ZeRO 1; at ZeRO 2 the last rank only, whose
            # decision rank 0 (which writes steps.csv) and the others must share
            if [ "$z" = 1 ]; then
                COURSE_FAULT_OVERFLOW_STEP=2 job "" 4 "$TRAIN05" $f --zero $z $layout --out "$d/$name"
            else
                COURSE_FAULT_OVERFLOW_STEP=2 COURSE_FAULT_OVERFLOW_RANK=3 job "" 4 "$TRAIN05" $f --zero $z $layout \
                    --out "$d/$name"
            fi
            assert_success
            assert_equal "--zero $z $layout: $(csv_column "$d/$name/steps.csv" skipped | tr '\n' ' ')" \
                "--zero $z $layout: $skipped"
            # a rank that updated at step 2 would move step 3's loss off 01's (by 2e-3 if all did)
            assert_losses_within "$d/ref" "$d/$name" 3 1e-4
        done
    done
}

@test "a rank killed while writing its shard of a checkpoint leaves the previous one intact, and another layout resumes it" {
    local d="$BATS_TEST_TMPDIR" f="$FLAGS --steps 6" z="--zero 3 --stop-after 4 --save-every 2"
    job "" 2 "$TRAIN02" $f --out "$d/full"
    assert_success
    # the same sharded run without the fault: its time bounds the time to the kill
    job "" 2 "$TRAIN05" $f $z --save "$d/ck.clean" --out "$d/clean"
    assert_success
    local clean="$seconds"

    # rank 1 dies in the step-4 save, after writing its parameters, before its moments
    job save:1:2 2 "$TRAIN05" $f $z --save "$d/ck" --out "$d/killed"
    assert_killed 1 "$clean"
    run "$REPO/common/ckpt" verify "$d/ck"
    assert_success
    assert_output --regexp "^ok [0-9a-f]{16} step 2 " # the step-2 checkpoint, whole
    # the half-written one: rank 0 removed it when mpirun ended the job (SIGTERM, util.h)
    [ ! -e "$d/ck.tmp" ] || fail "the killed save left $d/ck.tmp"

    job "" 2 "$TRAIN04" $f --resume "$d/ck" --out "$d/resumed"
    assert_success
    assert_same_losses "$(step_losses "$d/full/steps.csv" | sed -n 3,6p)" "$(step_losses "$d/resumed/steps.csv")"
}

@test "a save killed half-way with no survivor to clean up leaves a .tmp never taken for a checkpoint" {
    local d="$BATS_TEST_TMPDIR"
    COURSE_FAULT_KILL=save:0:2 run "$TRAIN01" $FLAGS --steps 4 --save-every 2 --save "$d/ck" --out "$d/out"
    assert_equal "$status" 137 # SIGKILL, as a machine that dies
    run --separate-stderr "$REPO/common/ckpt" verify "$d/ck.tmp"
    assert_equal "$status" 2 # no header yet
    [[ "$stderr" == *"not a checkpoint of this course"* ]]
    run "$REPO/common/ckpt" verify "$d/ck"
    assert_output --regexp "^ok [0-9a-f]{16} step 2 "
}

@test "300 steps on 4 ranks, saved and resumed every 50 steps, give the uninterrupted run's losses" {
    local d="$BATS_TEST_TMPDIR" f="--device cpu --steps 300 --batch 8 --eval-batches 1 --sample 0 --quiet"
    f="$f --data $BATS_FILE_TMPDIR/corpus.txt"
    mpirun_np 4 "$TRAIN02" $f --out "$d/full" >/dev/null
    local resume="" segments=() k
    for k in 50 100 150 200 250 300; do
        mpirun_np 4 "$TRAIN02" $f --stop-after $k --save "$d/ck" $resume --out "$d/to$k" >/dev/null
        resume="--resume $d/ck"
        segments+=("$d/to$k/steps.csv")
    done
    assert_same_losses "$(step_losses "$d/full/steps.csv")" "$(step_losses "${segments[@]}")"
    assert_equal "$(step_losses "${segments[@]}" | wc -l)" 300
}

@test "a malformed COURSE_FAULT_KILL is refused with one line" {
    COURSE_FAULT_KILL=allreduce run --separate-stderr "$TRAIN02" $FLAGS --steps 1 --out "$BATS_TEST_TMPDIR/bad"
    assert_equal "$status" 2
    # (then MPI_Abort's own notice)
    assert_equal "${stderr_lines[0]}" "error: COURSE_FAULT_KILL=allreduce: expected NAME:RANK or NAME:RANK:N"
    assert_equal "$(grep -c '^error:' <<<"$stderr")" 1
}

@test "every malformed COURSE_FAULT_* value is refused at start-up with one line" {
    local bad
    for bad in KILL=allreduce:x SKIP=allreduce KILL=allreduce:1:0 SKIP=:1 DISK_FULL=steps.csv:lots DISK_FULL=:5 \
        NAN_STEP=three NAN_STEP=0 OVERFLOW_STEP=2x OVERFLOW_RANK=-1 REPLICA_RANK=one; do
        run --separate-stderr env "COURSE_FAULT_$bad" "$TRAIN01" $FLAGS --steps 1 --out "$BATS_TEST_TMPDIR/bad"
        assert_equal "$status" 2
        assert_equal "${#stderr_lines[@]}" 1
        [[ "${stderr_lines[0]}" == "error: COURSE_FAULT_${bad%%=*}=${bad#*=}: expected "* ]] ||
            fail "COURSE_FAULT_$bad: ${stderr_lines[0]}"
        [ ! -e "$BATS_TEST_TMPDIR/bad/steps.csv" ] || fail "COURSE_FAULT_$bad: the run started"
    done
}

@test "an unknown fault point, a point with no call to skip, and a rank the job does not have are refused in one line naming the valid ones" {
    local out="$BATS_TEST_TMPDIR/bad"
    COURSE_FAULT_KILL=bogusname:0 run --separate-stderr "$TRAIN01" $FLAGS --steps 1 --out "$out"
    assert_equal "$status" 2
    assert_equal "${#stderr_lines[@]}" 1
    assert_equal "${stderr_lines[0]}" "error: COURSE_FAULT_KILL=bogusname:0: unknown point 'bogusname' (valid: allreduce, reduce_scatter, allgather, broadcast, alltoall, send, recv, sendrecv, wait_posted, host_allreduce, host_gather, barrier, worker, ring, save)"
    COURSE_FAULT_SKIP=save:0 run --separate-stderr "$TRAIN01" $FLAGS --steps 1 --out "$out"
    assert_equal "$status" 2
    assert_equal "${stderr_lines[0]}" "error: COURSE_FAULT_SKIP=save:0: no call to skip at point 'save' (valid: allreduce, reduce_scatter, allgather, broadcast, alltoall, send, recv, sendrecv, wait_posted, host_allreduce, host_gather, barrier)"
    COURSE_FAULT_OVERFLOW_RANK=1 run --separate-stderr "$TRAIN01" $FLAGS --steps 1 --out "$out"
    assert_equal "$status" 2
    assert_equal "${stderr_lines[0]}" "error: COURSE_FAULT_OVERFLOW_RANK=1: rank 1 is not in this job (valid: 0..0, a job of 1 rank)"
    [ ! -e "$out/steps.csv" ] || fail "a refused fault started the run"
    # on 2 ranks: every rank refuses it alike, the job says it once
    local variable
    for variable in COURSE_FAULT_KILL=send:2 COURSE_FAULT_SKIP=allreduce:2:3; do
        run --separate-stderr env "$variable" bash -c 'mpirun_np 2 "$@"' job "$TRAIN02" $FLAGS --steps 1 --out "$out"
        assert_equal "$status" 2
        assert_equal "${stderr_lines[0]}" "error: $variable: rank 2 is not in this job (valid: 0..1, a job of 2 ranks)"
        assert_equal "$(grep -c '^error:' <<<"$stderr")" 1
    done
}

@test "README.md lists the fault points of util.c's table, no more and no fewer" {
    COURSE_FAULT_KILL=bogusname:0 run --separate-stderr "$TRAIN01" $FLAGS --steps 1 --out "$BATS_TEST_TMPDIR/bad"
    local table="${stderr_lines[0]#*(valid: }"
    table="$(tr -d ')' <<<"$table" | tr ',' '\n' | tr -d ' ' | sort)"
    [ "$(wc -l <<<"$table")" -ge 14 ] || fail "the refusal lists $(wc -l <<<"$table") points: $table"
    # README's paragraph on fault injection, up to the sentence naming the table
    local readme
    readme="$(sed -n '/^- Fault injection:/,/The points are one table/p' "$REPO/README.md" |
        grep -o '`[a-z_]*`' | tr -d '`' | sort -u)"
    assert_equal "$readme" "$table"
}

@test "a malformed COURSE_FAULT_SKIP on a multi-rank job is refused once, before training" {
    COURSE_FAULT_SKIP=allreduce:one run --separate-stderr bash -c 'mpirun_np 2 "$@"' job "$TRAIN05" $FLAGS --steps 1 --zero 1 --out "$BATS_TEST_TMPDIR/bad"
    assert_equal "$status" 2
    assert_equal "${stderr_lines[0]}" "error: COURSE_FAULT_SKIP=allreduce:one: expected NAME:RANK or NAME:RANK:N"
    assert_equal "$(grep -c '^error:' <<<"$stderr")" 1
}

# ---- a frozen rank and the watchdog (common/comm/watchdog.h) ----

# Flags of a run long enough to be frozen mid-way: progress lines on (the
# test waits for the first), a 5 s --timeout.
LONG="--device cpu --batch 12 --sample 0 --data $BATS_FILE_TMPDIR/corpus.txt --steps 2000 --timeout 5"

# The launcher of start_job: mpirun_np (plain mpirun), or mpirun_sh.
launcher=mpirun_np
mpirun_sh() {
    local np="$1"
    shift
    "$REPO/common/scripts/mpirun.sh" -np "$np" "$@"
}

# start_job NP PROGRAM ARGS...: $launcher in the background, stdout and stderr
# in $BATS_TEST_TMPDIR/job.log; sets job_pid; returns when step 1 is logged.
start_job() {
    local log="$BATS_TEST_TMPDIR/job.log" i
    "$launcher" "$@" >"$log" 2>&1 &
    job_pid=$!
    for i in $(seq 600); do
        grep -q '^step ' "$log" && return 0
        kill -0 "$job_pid" 2>/dev/null || fail "the job ended before its first step: $(cat "$log")"
        sleep 0.1
    done
    fail "no step logged in 60 s"
}

# descendants PID: the processes under PID, at any depth.
descendants() {
    local child
    for child in $(pgrep -P "$1"); do
        echo "$child"
        descendants "$child"
    done
}

# rank_pid RANK: the process id of that rank of the job (under mpirun, which
# gives each rank OMPI_COMM_WORLD_RANK).
rank_pid() {
    local pid try
    for try in $(seq 50); do # a loaded machine may show the process tree late
        for pid in $(descendants "$job_pid"); do
            if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
                echo "$pid"
                return
            fi
        done
        sleep 0.1
    done
    fail "no rank $1 under mpirun $job_pid: $(ps -o pid,ppid,args --ppid "$job_pid" 2>&1)"
}

# wait_job LIMIT: wait up to LIMIT seconds for the job to end; sets status,
# output (the log) and seconds (from the call).
wait_job() {
    local start="$EPOCHREALTIME" limit="$1"
    while kill -0 "$job_pid" 2>/dev/null; do
        awk -v a="$start" -v b="$EPOCHREALTIME" -v l="$limit" 'BEGIN { exit !(b - a > l) }' && break
        sleep 0.2
    done
    seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
    kill -0 "$job_pid" 2>/dev/null && fail "the job still runs ${seconds}s later: $(tail -5 "$BATS_TEST_TMPDIR/job.log")"
    status=0
    wait "$job_pid" || status=$?
    output="$(cat "$BATS_TEST_TMPDIR/job.log")"
}

# Nothing is left stopped or running when a test fails half-way.
teardown() {
    [ -z "${stopped_pid:-}" ] || kill -CONT "$stopped_pid" 2>/dev/null || true
    [ -z "${job_pid:-}" ] || kill -KILL "$job_pid" 2>/dev/null || true
    [ -z "${stopped_pid:-}" ] || kill -KILL "$stopped_pid" 2>/dev/null || true
}

# freeze_check RANK NP PROGRAM ARGS...: SIGSTOP that rank after step 1; the
# job ends within --timeout + 10 s, naming the rank as never arrived (and no
# other rank), and the other ranks leave flight files listing their calls.
# Sets verdict: the watchdog's error line.
freeze_check() {
    local rank="$1" np="$2" out="$BATS_TEST_TMPDIR/out"
    shift 2
    rm -rf "$out"
    start_job "$np" "$@" $LONG --out "$out"
    stopped_pid=$(rank_pid "$rank") || return 1
    kill -STOP "$stopped_pid"
    wait_job 25
    assert_failure
    awk -v s="$seconds" 'BEGIN { exit !(s < 15) }' || fail "the frozen job took ${seconds}s to end (--timeout 5)"
    assert_output --regexp "error: \[rank [0-9]+\] watchdog: .* has waited [0-9]+ s \(--timeout 5\): .*rank $rank never arrived"
    verdict="$(grep '^error: \[rank [0-9]*\] watchdog:' <<<"$output")"
    if grep -o 'rank [0-9]* never arrived' <<<"$verdict" | grep -vqx "rank $rank never arrived"; then
        fail "the watchdog blames a rank that runs: $verdict"
    fi
    kill -KILL "$stopped_pid" 2>/dev/null || true
    stopped_pid=""
    assert_output --partial "flight recorder written to $out/flight-"
    local other=$(( rank == 0 ? 1 : 0 ))
    [ -f "$out/flight-$other.txt" ] || fail "no flight file of rank $other"
    run cat "$out/flight-$other.txt"
    assert_output --partial "# flight recorder of rank $other"
    assert_output --regexp "WAITING [0-9.]+ s"
    assert_output --regexp "(allreduce|allgather|reduce_scatter|send|recv) +[0-9]+ g[0-9]+ \(ranks "
}

@test "a frozen data-parallel rank (SIGSTOP) is named by the watchdog within --timeout + 10 s" {
    freeze_check 1 2 "$TRAIN02"
}

@test "a frozen pipeline stage is named by the watchdog within --timeout + 10 s" {
    freeze_check 1 2 "$TRAIN04" --layers 4 --batch 8
}

@test "a frozen ZeRO-3 rank (prefetching) is named by the watchdog within --timeout + 10 s" {
    freeze_check 0 2 "$TRAIN05" --zero 3 --prefetch 1
}

@test "a frozen rank of a blocking context-parallel ring (--cp 4) is named, under mpirun and mpirun.sh, not the ranks that wait for it" {
    for launcher in mpirun_np mpirun_sh; do
        freeze_check 3 4 "$TRAIN03" --cp 4 --cp-send blocking
        # rank 0's flight file: its ring's send-receives name both ranks, to 1 and from 3
        assert_output --regexp "sendrecv +[0-9]+ g[0-9]+ \(ranks 0-3\) +1>3 "
    done
}

@test "a frozen ZB-H1 stage (--pp 3) is named, under mpirun and mpirun.sh, though the stage that times out waits for another" {
    for launcher in mpirun_np mpirun_sh; do
        freeze_check 2 3 "$TRAIN04" --layers 3 --pp 3 --micro 3 --schedule zb-h1
    done
}

@test "a rank killed under common/scripts/mpirun.sh is named by its rank, as plain mpirun names it" {
    run env COURSE_FAULT_KILL=allreduce:1 timeout 20 "$REPO/common/scripts/mpirun.sh" -np 2 "$TRAIN02" $FLAGS --steps 3 \
        --out "$BATS_TEST_TMPDIR/killed"
    assert_equal "$status" 137
    assert_output --partial "common/scripts/mpirun.sh: rank 1 of $TRAIN02 was killed by signal 9 (Killed)"
    # and Open MPI's own notices stay out of the way, as before
    refute_output --partial "-----"
    refute_output --partial "mpirun noticed"
}

@test "a rank that skips an all-reduce is named: the ranks called different collectives at one number" {
    COURSE_FAULT_SKIP=allreduce:1:3 job "" 2 "$TRAIN02" $FLAGS --steps 5 --timeout 5 --out "$BATS_TEST_TMPDIR/skip"
    assert_failure
    [ "$status" -ne 124 ] || fail "the job hung until timeout 20 ended it"
    assert_output --regexp "rank [01] is in [a-z_]*allreduce #([0-9]+) while rank [01] waits in [a-z_]*allreduce #\1: they called different collectives"
}

@test "SIGUSR1 to a rank writes its flight recorder to stderr and OUT/flight-RANK.txt, and the run goes on" {
    local out="$BATS_TEST_TMPDIR/out"
    # long enough (600 steps, 3 s at the fastest) for the watchdog thread, which
    # looks once a second, to dump while the run still goes on
    start_job 2 "$TRAIN02" ${LONG/--steps 2000/--steps 600} --out "$out"
    local pid
    pid=$(rank_pid 1)
    kill -USR1 "$pid"
    wait_job 120
    assert_success
    assert_output --regexp "# flight recorder of rank 1 \(pid [0-9]+\) at [0-9:]+, on SIGUSR1"
    assert_equal "$(csv_column "$out/steps.csv" step | tail -1)" 600
    run cat "$out/flight-1.txt"
    assert_output --partial "on SIGUSR1"
    assert_output --regexp "allreduce +[0-9]+ g0 \(ranks 0-1\) +- +[0-9]+ +[0-9]+ .* done"
}

@test "--timeout takes whole seconds from 0 to a week" {
    run --separate-stderr bash -c 'mpirun_np 1 "$@"' job "$TRAIN02" $FLAGS --steps 1 --timeout -1 --out "$BATS_TEST_TMPDIR/t"
    assert_equal "$status" 2
    assert_equal "${stderr_lines[0]}" "error: --timeout: -1 is out of range (valid: 0..604800)"
}

# ---- Ctrl-C and kill (util.h: interrupt_handlers_install) ----

# wait_for_save DIR: returns while a save is being written (DIR/ck.tmp exists),
# after a first checkpoint DIR/ck was completed.
wait_for_save() {
    local i
    for i in $(seq 3000); do
        [ -e "$1/ck" ] && break
        sleep 0.02
    done
    [ -e "$1/ck" ] || fail "no checkpoint saved within 60 s"
    until [ -e "$1/ck.tmp" ]; do
        kill -0 "$job_pid" 2>/dev/null || fail "the job ended before a second save"
    done
}

# signal_job SIGNAL: send it to the job started in the background, wait for
# the job to end; sets status.
signal_job() {
    kill -"$1" "$job_pid"
    status=0
    wait "$job_pid" || status=$?
}

@test "Ctrl-C during a save ends 01 with status 130, the step and the last checkpoint named, and no .tmp left" {
    local d="$BATS_TEST_TMPDIR"
    "$TRAIN01" --device cpu --model small --batch 4 --steps 2000 --sample 0 --quiet --data "$BATS_FILE_TMPDIR/corpus.txt" \
        --save-every 1 --save "$d/ck" --out "$d/out" 2>"$d/err" &
    job_pid=$!
    wait_for_save "$d"
    signal_job INT
    assert_equal "$status" 130
    run cat "$d/err"
    assert_output --regexp "^interrupted at step [0-9]+ by SIGINT; last checkpoint: step [0-9]+ at $d/ck$"
    [ ! -e "$d/ck.tmp" ] || fail "the interrupted save left $d/ck.tmp"
    run "$REPO/common/ckpt" verify "$d/ck"
    assert_success
}

@test "SIGTERM ends 01 with status 143 and says that no checkpoint was saved" {
    local d="$BATS_TEST_TMPDIR"
    "$TRAIN01" $FLAGS --steps 100000 --out "$d/out" 2>"$d/err" &
    job_pid=$!
    local i
    for i in $(seq 1200); do
        [ -s "$d/out/steps.csv" ] && break
        sleep 0.05
    done
    signal_job TERM
    assert_equal "$status" 143
    run cat "$d/err"
    assert_output --regexp "^interrupted at step [0-9]+ by SIGTERM \(a kill, or mpirun ending the job\); no checkpoint saved$"
}

@test "Ctrl-C to mpirun during a save: rank 0 names the step and the last checkpoint once, and no .tmp is left" {
    local d="$BATS_TEST_TMPDIR"
    # mpirun itself, not a shell around it, is the process that gets the signal
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
        "$TRAIN02" --device cpu --model small --batch 4 --steps 2000 --sample 0 --quiet \
        --data "$BATS_FILE_TMPDIR/corpus.txt" --save-every 1 --save "$d/ck" --out "$d/out" >"$d/log" 2>&1 &
    job_pid=$!
    wait_for_save "$d"
    signal_job INT
    assert_equal "$status" 1 # mpirun's own status for a job it ended (Open MPI 4); the ranks exit 143
    run grep '^interrupted' "$d/log"
    assert_output --regexp "^interrupted at step [0-9]+ by SIGTERM \(a kill, or mpirun ending the job\); last checkpoint: step [0-9]+ at $d/ck$"
    assert_equal "${#lines[@]}" 1
    [ ! -e "$d/ck.tmp" ] || fail "the interrupted save left $d/ck.tmp"
    run "$REPO/common/ckpt" verify "$d/ck"
    assert_success
}

@test "an error that every rank meets is printed once, by rank 0, before MPI_Abort's notice" {
    COURSE_FAULT_NAN_STEP=2 job "" 2 "$TRAIN02" $FLAGS --steps 3 --out "$BATS_TEST_TMPDIR/nan"
    assert_equal "$status" 3
    assert_equal "$(grep -c '^error:' <<<"$output")" 1
    assert_output --partial "error: [rank 0] the loss became nan at step 2"
}
