#!/usr/bin/env bats
# Refactoring never changes the math: each chapter's losses on the CPU, for a
# few layouts, equal those recorded in tests/fixtures/losses/ (01-04's before
# the common layer was reshaped, issue 11; 05's and 06's later, on the second
# CPU of cpu.txt, where 01-04's reproduced): bit for bit (all 9 printed
# digits) on the kinds of CPU they were recorded on (fixtures/losses/cpu.txt
# holds a fingerprint of /proc/cpuinfo's vendor, family, model and flags, a
# line per CPU where every fixture reproduces exactly), within 1e-6 relative
# on others, because OpenBLAS picks its kernels (and so its rounding) by CPU
# model. The data is a frozen text (tests/fixtures/text.txt), so editing
# course.md does not move them. `tests/record_losses.sh` rewrites the
# fixtures (only do that when the math is meant to change, and say why in
# the commit).

load ../helpers

setup() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
}

# check NAME: run the layout NAME of tests/record_losses.sh and compare.
check() {
    local name="$1"
    run "$REPO/tests/record_losses.sh" --only "$name" --into "$(scratch)"
    assert_success
    run paste -d, <(csv_column "$REPO/tests/fixtures/losses/$name.csv" loss) <(csv_column "$(scratch)/$name.csv" loss)
    assert_equal "$(echo "$output" | grep -c '[0-9],[0-9]')" "$(csv_column "$REPO/tests/fixtures/losses/$name.csv" loss | wc -l)"
    local tolerance=1e-6
    grep -qxF "$(grep -m5 -E '^(vendor_id|cpu family|model|model name|flags)' /proc/cpuinfo | md5sum | cut -c1-16)" \
        "$REPO/tests/fixtures/losses/cpu.txt" && tolerance=0
    echo "$output" | awk -F, -v tol="$tolerance" '{ r = ($1 - $2) / $1; if (r < 0) r = -r;
                                                    if (r > tol) { print "step " NR ": " $0; bad = 1 } }
                                                  END { exit bad }'
}

@test "01's losses are the recorded ones (micro-batches, recompute)" {
    check 01
    check 01-micro2-recompute
}

@test "02's losses are the recorded ones (flat on 3 ranks, overlap with the ring on 2)" {
    check 02-flat-3
    check 02-overlap-ring-2
}

@test "03's losses are the recorded ones (layer split and tensor parallel)" {
    check 03-layer-2
    check 03-tensor-2
}

@test "04's losses are the recorded ones (1F1B on 2 stages, GPipe on 3)" {
    check 04-1f1b-2
    check 04-gpipe-3
}

@test "05's losses are the recorded ones (ZeRO-1 on 2 ranks, ZeRO-3 on 3 with 2 micro-batches)" {
    check 05-zero1-2
    check 05-zero3-3
}

@test "06's losses are the recorded ones (offload on 2 ranks, and with the delayed update)" {
    check 06-offload-2
    check 06-offload-dpu-2
}
