#!/usr/bin/env bats
# title: bucketed overlap
# points: 3
# Exercise 02.2 (02_data_parallel/buckets.c, buckets_layer_done): launch
# each gradient bucket as soon as the backward pass has finished all of its
# layers. Graded by (1) the losses of --dp-mode overlap on 2 and 3 ranks
# against chapter 01 (a bucket launched too early sums unfinished gradients)
# and (2) the launch record: each bucket must go right after its earliest
# layer is done, not later (launching everything at the end is correct but
# overlaps nothing). Uses the library all-reduce, so it does not depend on 02.1.

load ../helpers

@test "overlap gives chapter 01's losses on 2 and 3 ranks" {
    d="$BATS_TEST_TMPDIR"
    "$REPO/01_single_gpu/train" --device cpu --steps 4 --batch 6 --sample 0 --quiet --out "$d/ref" >/dev/null
    for np in 2 3; do
        OMP_NUM_THREADS=1 mpirun_np $np "$REPO/02_data_parallel/train" --device cpu --steps 4 --batch 6 --sample 0 \
            --quiet --dp-mode overlap --bucket-mb 0.05 --out "$d/dp$np" >/dev/null
        paste -d, <(csv_column "$d/ref/steps.csv" loss) <(csv_column "$d/dp$np/steps.csv" loss) |
            awk -F, '{ n++; r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) bad = 1 } END { exit bad || n != 4 }'
    done
}

@test "each bucket is launched right after its earliest layer finishes" {
    run env OMP_NUM_THREADS=1 bash -c "$(declare -f mpirun_np); mpirun_np 2 '$REPO/02_data_parallel/train' \
        --device cpu --steps 1 --sample 0 --quiet --dp-mode overlap --bucket-mb 0.02 --print-buckets \
        --out '$BATS_TEST_TMPDIR/pb'"
    assert_success
    # lines: bucket  [lo, hi)  >= lowest_layer  launched_after
    echo "$output" | awk '/^ +[0-9]+ +\[/ { n++; gsub(/[\[\),>=]/, " "); split($0, f, " ");
                                            if (f[4] != f[5]) bad = 1 } END { exit bad || n < 4 }'
}
