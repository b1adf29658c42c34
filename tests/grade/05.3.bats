#!/usr/bin/env bats
# title: the stage-3 gather/free schedule
# points: 4
# Exercise 05.3 (05_zero/zero.c, zero_schedule_uses): stage 3's schedule of one
# micro-batch as data. Graded by (1) the schedule that --print-schedule
# prints, for 2 and 3 layers and --prefetch 0, 1, 2 and 7: the forwards of
# units -1..L then the backwards of L..-1, each once; the gathers in the
# order of the computations they serve, each computation's unit gathered
# before it and freed right after it; and, when computation c starts,
# exactly the units of computations c..c+K gathered (no fewer: prefetch
# ignored; no more: the pool holds K + 1 units); (2) the losses of
# --zero 3 with prefetch 0, 1 and 2 on 2 and 3 ranks against chapter 01.
# Catches freeing a unit before its computation (or not at all), a
# backward that reuses the forward's gather, ignoring --prefetch, gathering
# everything ahead, and the backward in forward order. Stage 3 also uses
# 05.1's shards, 05.2's reduce-scatter and 01.2's AdamW.

load ../helpers

FLAGS="--device cpu --steps 4 --batch 12 --sample 0 --quiet --eval-batches 1"

# check_schedule L K: the schedule printed for L layers and prefetch K follows the rules above.
check_schedule() {
    local L="$1" K="$2"
    run env OMP_NUM_THREADS=1 "$REPO/05_zero/train" $FLAGS --steps 1 --layers "$L" --zero 3 --prefetch "$K" \
        --print-schedule --out "$BATS_TEST_TMPDIR/s$L-$K"
    assert_success
    echo "$output" | awk -v L="$L" -v K="$K" '
        function fail(why) { printf "layers %d, prefetch %d, action %d (%s): %s\n", L, K, n, $0, why; bad = 1; exit 1 }
        function unit_of(c) { return c < U ? c - 1 : L - (c - U) }
        BEGIN { U = L + 2; C = 2 * U }
        /^  (gather|forward|backward|free) +unit -?[0-9]+$/ {
            op = $1; u = $3 + 0; n++
            if (want_free) {
                if (op != "free" || u != unit_of(c - 1)) fail("expected the free of unit " unit_of(c - 1))
                want_free = 0; frees++; next
            }
            if (op == "gather") {
                if (gathers >= C) fail("more gathers than computations")
                if (u != unit_of(gathers)) fail("expected the gather of unit " unit_of(gathers) " for computation " gathers)
                gathers++
                if (gathers - frees > K + 1) fail("more than prefetch + 1 units gathered at once")
            } else if (op == "forward" || op == "backward") {
                if (c >= C) fail("more computations than 2 (L + 2)")
                if (op != (c < U ? "forward" : "backward") || u != unit_of(c))
                    fail("expected the " (c < U ? "forward" : "backward") " of unit " unit_of(c))
                need = c + K + 1 < C ? c + K + 1 : C
                if (gathers != need) fail(gathers " gathers issued, expected " need " (computations " (c + 0) ".." (need - 1) ")")
                c++; want_free = 1
            } else fail("a free that does not follow its computation")
        }
        END { if (bad) exit 1
              if (c != C || gathers != C || frees != C || want_free)
                  { printf "layers %d, prefetch %d: %d computations, %d gathers, %d frees (expected %d each)\n", L, K, c, gathers, frees, C; exit 1 } }'
}

@test "the schedule computes every unit forward then backward, gathering K ahead and freeing right after" {
    for L in 2 3; do
        for K in 0 1 2 7; do
            check_schedule $L $K
        done
    done
}

@test "stage 3 gives chapter 01's losses with prefetch 0, 1 and 2 on 2 and 3 ranks" {
    d="$BATS_TEST_TMPDIR"
    "$TRAIN01" $FLAGS --micro 2 --out "$d/ref" >/dev/null
    for case in "2 0" "2 2" "3 1"; do
        set -- $case
        OMP_NUM_THREADS=1 mpirun_np $1 "$REPO/05_zero/train" $FLAGS --micro 2 --zero 3 --prefetch $2 \
            --out "$d/z$1-$2" >/dev/null
        assert_losses_match "$d/ref" "$d/z$1-$2" 4
    done
}
