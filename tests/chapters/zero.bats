#!/usr/bin/env bats
# 05_zero: every ZeRO stage gives chapter 01's losses on any number of ranks,
# holds the model-state memory of the ZeRO paper's formulas and sends the
# bytes of its formulas; bad input is refused.

load ../helpers


# Tiny model, 4 steps, a global batch of 12 (divisible by 2, 3, 4 ranks and by
# 2 or 3 ranks x 2 micro-batches); a private copy of the corpus.
FLAGS="--device cpu --steps 4 --batch 12 --sample 0 --quiet --eval-batches 1 --data $BATS_FILE_TMPDIR/corpus.txt"
# A shape whose units do not divide by 3 or 4 ranks: d 48, vocab 259 (the
# embedding has 259*48 + 64*48 elements, the head 2*48 + 259*48).
ODD="--dmodel 48 --heads 4 --vocab 259"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$TRAIN01" $FLAGS $ODD --out "$BATS_FILE_TMPDIR/ref" >/dev/null
    "$TRAIN01" $FLAGS $ODD --micro 2 --out "$BATS_FILE_TMPDIR/ref_micro" >/dev/null
    "$TRAIN01" $FLAGS --micro 2 --out "$BATS_FILE_TMPDIR/ref_micro_tiny" >/dev/null
}

zero() {
    local np="$1"
    shift
    OMP_NUM_THREADS=1 mpirun_np "$np" "$TRAIN05" $FLAGS "$@" >/dev/null
}

# Every stage on `np` ranks, with the uneven shape.
check_stages() {
    local np="$1"
    for stage in 0 1 2 3; do
        zero "$np" $ODD --zero $stage --out "$BATS_TEST_TMPDIR/$np-$stage"
        assert_losses_match "$BATS_FILE_TMPDIR/ref" "$BATS_TEST_TMPDIR/$np-$stage" 4
    done
}

@test "every ZeRO stage on 2 ranks matches single-device losses, units padded" { check_stages 2; }
@test "every ZeRO stage on 3 ranks matches single-device losses, units padded" { check_stages 3; }
@test "every ZeRO stage on 4 ranks matches single-device losses, units padded" { check_stages 4; }

# Stage 1 reduce-scatters on the calling thread, stages 2 and 3 on the
# communication thread, which waits for them its own way (common/comm/comm.h,
# "Cores"); MPI must still add the ranks' values in one order, so the losses
# agree in every printed digit, not only within 1e-4.
@test "stages 1, 2 and 3 on 4 ranks give the same losses to the last digit: the communication thread sums in MPI's order" {
    for stage in 1 2 3; do
        zero 4 $ODD --zero $stage --out "$BATS_TEST_TMPDIR/sum$stage"
    done
    run diff <(cut -d, -f2 "$BATS_TEST_TMPDIR/sum1/steps.csv") <(cut -d, -f2 "$BATS_TEST_TMPDIR/sum2/steps.csv")
    assert_success
    run diff <(cut -d, -f2 "$BATS_TEST_TMPDIR/sum1/steps.csv") <(cut -d, -f2 "$BATS_TEST_TMPDIR/sum3/steps.csv")
    assert_success
}

@test "gradient accumulation over 2 micro-batches matches the single device at stages 1-3" {
    for stage in 1 2 3; do
        zero 3 $ODD --micro 2 --zero $stage --out "$BATS_TEST_TMPDIR/acc$stage"
        assert_losses_match "$BATS_FILE_TMPDIR/ref_micro" "$BATS_TEST_TMPDIR/acc$stage" 4
    done
}

# early_gathers DIR: how many gathers of timeline.csv started before the
# computation ahead of theirs ended. timeline.csv lists each computation after
# the gather of its unit, so per rank and step the compute row just before a
# gather row is the previous computation. Without prefetch a gather is issued
# only after that computation (never early); with prefetch K it was issued K
# computations ahead, so it starts early whether the worker runs it at once
# or while the computation runs (times count from the start of each step).
early_gathers() {
    awk -F, 'NR > 1 { who = $1 " " $2 }
             NR > 1 && ($4 == "fwd" || $4 == "bwd") { last_end[who] = $6 }
             NR > 1 && $4 == "gather" && (who in last_end) && $5 + 0 < last_end[who] + 0 { c++ }
             END { print c + 0 }' "$1/timeline.csv"
}

@test "stage 3 gives the same losses, bit for bit, with prefetch 0 and 2, holds prefetch + 1 gathered units, and gathers ahead of the computation only when prefetching" {
    for k in 0 2; do
        zero 2 $ODD --micro 2 --zero 3 --prefetch $k --out "$BATS_TEST_TMPDIR/pf$k"
        assert_losses_match "$BATS_FILE_TMPDIR/ref_micro" "$BATS_TEST_TMPDIR/pf$k" 4
    done
    run diff <(cut -d, -f2 "$BATS_TEST_TMPDIR/pf0/steps.csv") <(cut -d, -f2 "$BATS_TEST_TMPDIR/pf2/steps.csv")
    assert_success
    gathered() { awk -F, '$1 == 0 && $2 == "device" && $3 == "gathered" { print $4 }' "$1/memory.csv"; }
    # the largest unit, a block: 12 C^2 + 13 C = 28272 elements, 14136 per rank
    assert_equal "$(gathered "$BATS_TEST_TMPDIR/pf0")" "$((1 * 28272 * 4))"
    assert_equal "$(gathered "$BATS_TEST_TMPDIR/pf2")" "$((3 * 28272 * 4))"
    # timeline.csv: computations and gathers on rows of their own; without
    # prefetch a computation waits for its gather, with it the worker thread
    # gathers the next units before the computations ahead of them end
    assert_equal "$(awk -F, 'NR > 1 && $4 == "gather"' "$BATS_TEST_TMPDIR/pf0/timeline.csv" | wc -l)" "$((2 * 4 * 2 * 8))"
    assert_equal "$(early_gathers "$BATS_TEST_TMPDIR/pf0")" 0
    [ "$(early_gathers "$BATS_TEST_TMPDIR/pf2")" -gt 0 ]
    # the Gantt chart of it: a compute and a comm row per rank
    python="$(plot_python)"
    if "$python" -c "import matplotlib" 2>/dev/null; then
        run "$python" "$REPO/common/python/plot.py" --gantt "$BATS_TEST_TMPDIR/pf2" --out "$BATS_TEST_TMPDIR/plots"
        assert_success
        [ -s "$BATS_TEST_TMPDIR/plots/gantt-pf2.png" ]
    fi
}

# The worker runs its collectives in the order they were queued; stage 3
# queues the gathers of the next computations before the reduce-scatter of
# the unit just back-propagated (zero.h, "Queue order"), so that the
# reduce-scatter can run under the next backward instead of holding up its
# gather. common/python/overlap.py --check-order reads that order back from
# timeline.csv (it does not depend on how loaded the machine is) and fails
# when a gather ran behind a reduce-scatter queued after it.
@test "stage 3 queues each backward's gather ahead of the previous unit's reduce-scatter, at prefetch 0 and 1" {
    for k in 0 1; do
        zero 2 --micro 2 --zero 3 --prefetch $k --out "$BATS_TEST_TMPDIR/order$k"
        assert_losses_match "$BATS_FILE_TMPDIR/ref_micro_tiny" "$BATS_TEST_TMPDIR/order$k" 4
        run python3 "$REPO/common/python/overlap.py" --check-order "$BATS_TEST_TMPDIR/order$k"
        assert_success
        assert_output --partial "reduce_scatter"
        refute_output --partial "after the reduce-scatter"
    done
    run diff <(cut -d, -f2 "$BATS_TEST_TMPDIR/order0/steps.csv") <(cut -d, -f2 "$BATS_TEST_TMPDIR/order1/steps.csv")
    assert_success
}

# comm_ms is the time the step waited on communication (every chapter);
# comm_busy_ms the time the collectives ran. Stage 0 runs its all-reduce on
# the caller, so it waits for all of it; stage 3 runs its gathers and
# reduce-scatters on the communication thread.
@test "steps.csv has comm_ms (waited) and comm_busy_ms (ran): equal at stage 0, both there at stage 3" {
    zero 2 --zero 0 --out "$BATS_TEST_TMPDIR/busy0"
    zero 2 --zero 3 --out "$BATS_TEST_TMPDIR/busy3"
    assert_equal "$(head -1 "$BATS_TEST_TMPDIR/busy0/steps.csv")" \
        "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss,idle_fraction,ep_rows_max,ep_rows_mean,bubble,bytes_sent,comm_busy_ms"
    paste -d, <(csv_column "$BATS_TEST_TMPDIR/busy0/steps.csv" comm_ms) \
        <(csv_column "$BATS_TEST_TMPDIR/busy0/steps.csv" comm_busy_ms) | awk -F, '{ n++; if ($1 != $2) bad = 1 } END { exit bad || n != 4 }'
    [ "$(csv_column "$BATS_TEST_TMPDIR/busy3/steps.csv" comm_busy_ms | awk '$1 > 0' | wc -l)" -eq 4 ]
}

@test "stage 3 prints its gather/free schedule: prefetch 1 gathers the next unit before computing one" {
    run env OMP_NUM_THREADS=1 "$TRAIN05" $FLAGS --steps 1 --zero 3 --prefetch 1 --print-schedule \
        --out "$BATS_TEST_TMPDIR/sched"
    assert_success
    assert_output --partial "$(printf 'gather   unit -1\n  gather   unit 0\n  forward  unit -1\n  free     unit -1\n  gather   unit 1')"
}

# Model-state bytes (params + grads + optimizer) of every rank against the
# ZeRO formulas, P parameters. fp32 (4 + 4 + 8 bytes a parameter): stage 0
# 16P, 1 8P + 8P/N, 2 4P + 12P/N, 3 16P/N; 16-bit (2 + 2 + 12, the master
# weights in the optimizer state): 16P, 4P + 12P/N, 2P + 14P/N, 16P/N;
# within 5% (the tiny model's units divide by 2 and 4: exact).
# Bytes sent per rank per step: an all-reduce's 2(N-1)/N x (4 or 2)P at
# stages 0-2, 1.5 times that at stage 3, within 5%. check_formulas N
# [PRECISION [STEPS]] checks every stage; check_run_formulas one run.
check_run_formulas() {
    local out="$1" np="$2" stage="$3" precision="$4"
    P=$(csv_column "$out/run.csv" params)
    assert_equal "$(csv_column "$out/run.csv" zero)" "$stage"
    awk -F, -v P="$P" -v N="$np" -v s="$stage" -v p="$precision" '
        BEGIN { if (p == "fp32") { f[0] = 16 * P; f[1] = 8 * P + 8 * P / N; f[2] = 4 * P + 12 * P / N }
                else { f[0] = 16 * P; f[1] = 4 * P + 12 * P / N; f[2] = 2 * P + 14 * P / N }
                f[3] = 16 * P / N }
        $2 == "device" && ($3 == "params" || $3 == "grads" || $3 == "optimizer") { state[$1] += $4 }
        END { for (r = 0; r < N; r++) { d = (state[r] - f[s]) / f[s]; if (d < 0) d = -d
                  if (d > 0.05) { print "rank " r ": " state[r] " bytes, formula " f[s]; bad = 1 } }
              exit bad }' "$out/memory.csv"
    sent=$(csv_column "$out/run.csv" bytes_sent_per_step)
    awk -v b="$sent" -v P="$P" -v N="$np" -v s="$stage" -v p="$precision" 'BEGIN {
        f = 2 * (N - 1) / N * (p == "fp32" ? 4 : 2) * P; if (s == 3) f *= 1.5; d = (b - f) / f; if (d < 0) d = -d
        if (d > 0.05) { print "stage " s ": " b " bytes sent per step, formula " f; exit 1 } }'
    # comm_ms: the time spent waiting on communication, within the step
    csv_column "$out/steps.csv" comm_ms | paste -d, - <(csv_column "$out/steps.csv" step_ms) |
        awk -F, '{ n++; if (!($1 > 0 && $1 <= $2)) { print "comm_ms " $1 " of a " $2 " ms step"; bad = 1 } } END { exit bad || !n }'
}

check_formulas() {
    local np="$1" precision="${2:-fp32}" steps="${3:-2}"
    for stage in 0 1 2 3; do
        out="$BATS_TEST_TMPDIR/m$np-$stage"
        zero "$np" --steps "$steps" --precision "$precision" --zero $stage --out "$out"
        check_run_formulas "$out" "$np" "$stage" "$precision"
    done
}

@test "model-state memory and bytes sent on 2 ranks follow the ZeRO formulas at every stage" { check_formulas 2; }
@test "model-state memory and bytes sent on 4 ranks follow the ZeRO formulas at every stage" { check_formulas 4; }
@test "in bf16, model-state memory and bytes sent on 4 ranks follow the 16-bit ZeRO formulas at every stage" {
    check_formulas 4 bf16 1
}

# ---- 16 bits: against 01 in the same precision, within the course's 1e-2
# over 20 steps (precision.bats says why); one set of runs checks the 16-bit
# formulas on 2 ranks too. ----
@test "every ZeRO stage in bf16 on 2 ranks matches 01 in bf16 and follows the 16-bit formulas" {
    local flags="--steps 20 --precision bf16"
    # shellcheck disable=SC2086
    "$TRAIN01" $FLAGS $flags --out "$BATS_TEST_TMPDIR/ref" >/dev/null
    for stage in 0 1 2 3; do
        zero 2 $flags --zero $stage --out "$BATS_TEST_TMPDIR/$stage"
        assert_losses_within "$BATS_TEST_TMPDIR/ref" "$BATS_TEST_TMPDIR/$stage" 20 1e-2
        check_run_formulas "$BATS_TEST_TMPDIR/$stage" 2 $stage bf16
    done
}

@test "every ZeRO stage in fp16 on 3 ranks, units padded, 2 micro-batches, matches 01 in fp16" {
    local flags="--steps 20 --precision fp16 --micro 2"
    # shellcheck disable=SC2086
    "$TRAIN01" $FLAGS $ODD $flags --out "$BATS_TEST_TMPDIR/ref" >/dev/null
    for stage in 0 1 2 3; do
        zero 3 $ODD $flags --zero $stage --out "$BATS_TEST_TMPDIR/$stage"
        assert_losses_within "$BATS_TEST_TMPDIR/ref" "$BATS_TEST_TMPDIR/$stage" 20 1e-2
    done
}

@test "an fp16 overflow on one rank's slices skips that step on every rank, weights unchanged, at stages 0 and 3" {
    # the fault hits the last rank's check only (COURSE_FAULT_OVERFLOW_RANK); rank 0 writes steps.csv
    for stage in 0 3; do
        local d="$BATS_TEST_TMPDIR/o$stage"
        COURSE_FAULT_OVERFLOW_STEP=3 COURSE_FAULT_OVERFLOW_RANK=1 zero 2 --steps 5 --eval-every 1 --precision fp16 --zero $stage --out "$d"
        assert_equal "$(csv_column "$d/steps.csv" skipped | tr '\n' ' ')" "0 0 1 0 0 "
        assert_equal "$(csv_column "$d/steps.csv" loss_scale | tr '\n' ' ')" "65536 65536 65536 32768 32768 "
        local val
        val=($(csv_column "$d/steps.csv" val_loss))
        assert_equal "${val[2]}" "${val[1]}"
        [ "${val[3]}" != "${val[2]}" ]
    done
}

# Bad input: exit 2 and one line naming the flag and its valid range.
refused() {
    run --separate-stderr timeout 5 "$TRAIN05" --device cpu --sample 0 --quiet --out "$(scratch)/out" "$@"
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" "1"
    [[ "$stderr" == error:*"$1"* ]] || { echo "stderr: $stderr (expected: $1)"; return 1; }
}

@test "--zero outside 0-3 is refused with the valid range" {
    refused "--zero" --zero 4
    [[ "$stderr" == *"0..3"* ]]
    refused "--zero" --zero -1
}

@test "a negative --prefetch is refused with the valid range" {
    refused "--prefetch" --prefetch -1
    [[ "$stderr" == *"0..64"* ]]
}

@test "--prefetch and --print-schedule below stage 3 are refused, not ignored" {
    for stage in 0 1 2; do
        run --separate-stderr timeout 5 "$TRAIN05" $FLAGS --zero $stage --prefetch 2 --out "$(scratch)/out"
        assert_equal "$status" 2
        assert_equal "$stderr" "error: --prefetch needs --zero 3 (only stage 3 gathers parameters)"
        run --separate-stderr timeout 5 "$TRAIN05" $FLAGS --zero $stage --print-schedule --out "$(scratch)/out"
        assert_equal "$status" 2
        assert_equal "$stderr" "error: --print-schedule needs --zero 3 (only stage 3 has a gather/free schedule)"
    done
    [ ! -e "$(scratch)/out/steps.csv" ]
}

# ZeRO changes what chapter 04's --pp defaults to (one stage: dp is the
# world) and what --print-schedule prints at stage 3: zero_flags retells
# those rows (FLAG_RETELL), which keep chapter 04's place in --help.
@test "05's --help retells chapter 04's --pp and --print-schedule in their place; 04's tells its own" {
    run "$TRAIN05" --help
    assert_success
    assert_output --partial "  --pp P                     pipeline stages, 1..layers (default: 1, or world size / (tp x dp) with --dp)"
    assert_output --partial "print every stage's list of actions and exit (with --zero 3: the gather/free"
    refute_output --partial "(default: world size / (tp x dp)); with --pp"
    local pp print zero
    pp=$(grep -n -- "^  --pp P " <<<"$output" | cut -d: -f1)
    print=$(grep -n -- "^  --print-schedule " <<<"$output" | cut -d: -f1)
    zero=$(grep -n -- "^  --zero " <<<"$output" | cut -d: -f1)
    [ -n "$pp" ] && [ -n "$print" ] && [ -n "$zero" ] && [ "$pp" -lt "$print" ] && [ "$print" -lt "$zero" ]
    assert_equal "$(grep -c -- "^  --pp P " <<<"$output")" "1"
    run "$TRAIN04" --help
    assert_success
    assert_output --partial "pipeline stages, 1..layers (default: world size / (tp x dp)); with --pp"
    refute_output --partial "gather/free"
}

@test "the default prefetch passes at stage 1; the header names prefetch at stage 3 only; the closing line gives the peak device memory" {
    run env OMP_NUM_THREADS=1 "$TRAIN05" $FLAGS --steps 1 --zero 1 --out "$(scratch)/one"
    assert_success
    [[ "${lines[0]}" == *"| zero 1 | 136960 parameters"* ]]
    local peak
    peak="$(csv_column "$(scratch)/one/run.csv" peak_device_bytes)"
    assert_line --partial "| peak device memory $(awk -v b="$peak" 'BEGIN { printf "%.1f", b / 1048576 }') MiB | "
    run env OMP_NUM_THREADS=1 "$TRAIN05" $FLAGS --steps 1 --zero 3 --prefetch 2 --out "$(scratch)/three"
    assert_success
    [[ "${lines[0]}" == *"| zero 3 | prefetch 2 | 136960 parameters"* ]]
}

@test "ranks with different --zero end the job naming the flag" {
    run --separate-stderr env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 30 \
        mpirun --oversubscribe -np 2 "$REPO/tests/by_rank" "$TRAIN05" "--zero 1" "--zero 2" \
        --device cpu --steps 1 --sample 0 --quiet --out "$(scratch)/out"
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c '^error:')" 1
    [[ "$stderr" == *"error: the ranks disagree on --zero:"* ]]
}
