#!/usr/bin/env bats
# multinode.bats: ranks on separate machines cannot share memory; they talk
# over the network. Open MPI picks its transports (BTLs) per pair of ranks: on
# one machine, shared memory (vader); across machines, TCP (or InfiniBand).
# Excluding shared memory (OMPI_MCA_btl=tcp,self, on the loopback interface)
# makes ranks on this machine talk as ranks on separate nodes would, and the
# chapters must still give chapter 01's losses. course.md ("Beyond one
# machine") says how to run on real nodes.

load ../helpers

FLAGS="--device cpu --steps 4 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$REPO/01_single_gpu/train" $FLAGS --batch 12 --out "$BATS_FILE_TMPDIR/ref12" >/dev/null
    "$REPO/01_single_gpu/train" $FLAGS --batch 8 --layers 4 --out "$BATS_FILE_TMPDIR/ref8" >/dev/null
}

# mpirun with the shared-memory transport excluded: TCP between ranks, self within one.
tcp_only() {
    OMP_NUM_THREADS=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo mpirun_np "$@"
}

@test "without shared memory and TCP, two ranks cannot reach each other: the TCP-only runs really use TCP" {
    run timeout 60 env OMP_NUM_THREADS=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self \
        bash -c "$(declare -f mpirun_np); mpirun_np 2 '$REPO/02_data_parallel/train' $FLAGS --batch 12 \
                 --out '$BATS_TEST_TMPDIR/self'"
    assert_failure
    [ "$status" -ne 124 ] # refused at start-up, not hung
}

@test "data parallel on 3 ranks over TCP only matches single-device losses" {
    for mode in flat overlap; do
        tcp_only 3 "$REPO/02_data_parallel/train" $FLAGS --batch 12 --dp-mode $mode --bucket-mb 0.05 \
            --out "$BATS_TEST_TMPDIR/dp-$mode" >/dev/null
        assert_losses_match "$BATS_FILE_TMPDIR/ref12" "$BATS_TEST_TMPDIR/dp-$mode" 4
    done
}

@test "the layer split and tensor parallelism on 2 ranks over TCP only match single-device losses" {
    tcp_only 2 "$REPO/03_model_parallel/train" $FLAGS --batch 12 --mp layer --out "$BATS_TEST_TMPDIR/layer" >/dev/null
    assert_losses_match "$BATS_FILE_TMPDIR/ref12" "$BATS_TEST_TMPDIR/layer" 4
    tcp_only 2 "$REPO/03_model_parallel/train" $FLAGS --batch 12 --mp tensor --tp 2 --out "$BATS_TEST_TMPDIR/tensor" \
        >/dev/null
    assert_losses_match "$BATS_FILE_TMPDIR/ref12" "$BATS_TEST_TMPDIR/tensor" 4
}

@test "two 2-stage 1F1B pipelines over TCP only match single-device losses" {
    tcp_only 4 "$REPO/04_pipeline/train" $FLAGS --layers 4 --batch 8 --micro 2 --dp 2 --schedule 1f1b \
        --out "$BATS_TEST_TMPDIR/pipe" >/dev/null
    assert_losses_match "$BATS_FILE_TMPDIR/ref8" "$BATS_TEST_TMPDIR/pipe" 4
}
