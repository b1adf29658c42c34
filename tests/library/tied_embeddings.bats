#!/usr/bin/env bats
# GPT-2's vocabulary in every chapter (model_config.h): --vocab 50257 padded to
# 50304 rows for the kernels, and --tie-embeddings (the head reads wte, its
# gradient adds into wte's). With tied embeddings every layout that keeps the
# embedding and the head bound on one rank for the whole step gives 01's
# losses (fp32 within 1e-4), and so do 04's stages, where the last stage keeps
# a copy of the embedding unit and sums its gradient with the first stage's
# (pipeline.h), the gradient norm counting it once, and ZeRO 2-3 on one
# stage, where the head's gradient of wte waits for the embedding unit's
# (zero.h), --offload on one stage (offload.h) and 03's layer split, which
# sends wte and its gradient between the ends (model_parallel.h), and ZeRO
# 1-2 and --offload on stages, where the first stage's shards own wte and
# the last stage's head reads a copy (tied_ends.h), with --tp its rows;
# mixed precision follows fp32 within 16 bits'
# tolerance, and 01 in the same precision more closely. Checkpoints record
# whether the weights are tied; a run that differs is refused.

load ../helpers

# Tiny model with 4 layers, 4 steps, a global batch of 8; a private copy of the corpus.
FLAGS="--device cpu --layers 4 --steps 4 --batch 8 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt --tie-embeddings"
export OMP_NUM_THREADS=1

setup_file() {
    local d="$BATS_FILE_TMPDIR"
    cp "$REPO/course.md" "$d/corpus.txt"
    "$TRAIN01" $FLAGS --out "$d/ref" >/dev/null
}

REF="$BATS_FILE_TMPDIR/ref"

@test "tied embeddings change the model: 01 tied has no lm_head and other losses than untied" {
    run "$TRAIN01" ${FLAGS/--tie-embeddings/} --out "$(scratch)/untied"
    assert_success
    [ "$(csv_column "$REF/steps.csv" loss | head -1)" != "$(csv_column "$(scratch)/untied/steps.csv" loss | head -1)" ]
    # the parameter count drops by the head's V x C = 256 x 64
    local tied untied
    tied="$(csv_column "$REF/run.csv" params)"
    untied="$(csv_column "$(scratch)/untied/run.csv" params)"
    assert_equal "$((untied - tied))" 16384
}

@test "tied embeddings: 02 on 2 ranks gives 01's losses" {
    mpirun_np 2 "$TRAIN02" $FLAGS --out "$(scratch)/dp2" >/dev/null
    assert_losses_match "$REF" "$(scratch)/dp2" 4
}

@test "tied embeddings: 03 tensor parallel on 2 ranks gives 01's losses" {
    mpirun_np 2 "$TRAIN03" $FLAGS --mp tensor --out "$(scratch)/tp2" >/dev/null
    assert_losses_match "$REF" "$(scratch)/tp2" 4
}

@test "tied embeddings: 04 one stage with --tp 2 gives 01's losses" {
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 1 --tp 2 --out "$(scratch)/tp2" >/dev/null
    assert_losses_match "$REF" "$(scratch)/tp2" 4
}

@test "tied embeddings: 05 --zero 1 on 2 ranks and 06 --zero 1 without --offload give 01's losses" {
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 1 --out "$(scratch)/z1" >/dev/null
    assert_losses_match "$REF" "$(scratch)/z1" 4
    mpirun_np 2 "$TRAIN06" $FLAGS --zero 1 --out "$(scratch)/z1_06" >/dev/null
    assert_losses_match "$REF" "$(scratch)/z1_06" 4
}

# assert_norms_match REF_DIR RUN_DIR [TOLERANCE]: steps.csv's grad_norm within 1e-4 (or TOLERANCE,
# relative) of the reference's
assert_norms_match() {
    run paste -d, <(csv_column "$1/steps.csv" grad_norm) <(csv_column "$2/steps.csv" grad_norm)
    assert_equal "$(echo "$output" | grep -c '[0-9],[0-9]')" 4
    echo "$output" | awk -F, -v tol="${3:-1e-4}" '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > tol) { print "step " NR ": " $0; bad = 1 } }
                              END { exit bad }'
}

# assert_resumed_match REF_DIR RUN_DIR TOLERANCE: a run resumed at step 2 of 4 has two
# losses, each within TOLERANCE (relative) of the reference's steps 3 and 4
assert_resumed_match() {
    run paste -d, <(csv_column "$1/steps.csv" loss | tail -2) <(csv_column "$2/steps.csv" loss)
    assert_equal "$(echo "$output" | grep -c '[0-9],[0-9]')" 2
    echo "$output" | awk -F, -v tol="$3" '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > tol) { print; exit 1 } }'
}

# ZeRO-2 and 3 keep the embedding unit's gradient only while it back-propagates:
# the head's gradient of wte waits for it (zero.h: tied_dwte); stage 3 gathers
# the embedding unit for the head too (tied_gathered).
@test "tied embeddings: ZeRO-2 and ZeRO-3 on one stage (05 with micro-batches and prefetch, 06 without --offload, 05 --tp 2 --zero 2) give 01's losses and gradient norms" {
    local d="$(scratch)" run_dir
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 2 --out "$d/z2" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --micro 2 --prefetch 1 --out "$d/z3" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --zero 3 --out "$d/z3_06" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 2 --pp 1 --tp 2 --out "$d/z2tp" >/dev/null
    for run_dir in "$d/z2" "$d/z3" "$d/z3_06" "$d/z2tp"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
}

# The offloaded step binds a unit at a time too (offload.h: tied_dwte): the
# head's gradient of wte crosses to the host with the embedding's.
@test "tied embeddings: 06 --offload on 1 and 2 ranks, with --tp 2, gives 01's losses and gradient norms" {
    local d="$(scratch)" run_dir
    "$TRAIN06" $FLAGS --offload --out "$d/off1" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --offload --out "$d/off2" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --offload --pp 1 --tp 2 --out "$d/offtp" >/dev/null
    for run_dir in "$d/off1" "$d/off2" "$d/offtp"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
}

@test "tied embeddings: 04 on 2 stages, 1F1B and ZB-H1, gives 01's losses and gradient norms" {
    for schedule in 1f1b zb-h1; do
        mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --micro 2 --schedule $schedule --out "$(scratch)/$schedule" >/dev/null
        assert_losses_match "$REF" "$(scratch)/$schedule" 4
        assert_norms_match "$REF" "$(scratch)/$schedule"
    done
}

# 03's layer split sends wte to the last stage before a forward and the head's
# gradient of wte back after each backward (model_parallel.h: tied_wte).
@test "tied embeddings: 03's layer split on 2 and 3 stages, with 2 replicas (overlap) and with --cp 2, gives 01's losses and norms; its checkpoint resumes in 01" {
    local d="$(scratch)" run_dir
    mpirun_np 2 "$TRAIN03" $FLAGS --mp layer --out "$d/l2" >/dev/null
    mpirun_np 3 "$TRAIN03" $FLAGS --mp layer --micro 2 --out "$d/l3" >/dev/null
    mpirun_np 4 "$TRAIN03" $FLAGS --mp layer --dp 2 --dp-mode overlap --out "$d/ldp" >/dev/null
    mpirun_np 4 "$TRAIN03" $FLAGS --mp layer --cp 2 --out "$d/lcp" >/dev/null
    for run_dir in "$d/l2" "$d/l3" "$d/ldp" "$d/lcp"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
    mpirun_np 2 "$TRAIN03" $FLAGS --mp layer --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$REF" "$d/one" 1e-5
}

# Interleaved stages hold several chunks; the last stage's copy of the
# embedding unit is one more run after them (pipeline.c's create_chunked_model).
@test "tied embeddings: 04 interleaved (--virtual 2) on 2 stages, with tp 2, with 2 replicas, and in bf16, gives 01's losses and norms; its checkpoint resumes in 01" {
    local d="$(scratch)" run_dir
    local v="--pp 2 --virtual 2 --schedule interleaved --micro 2"
    mpirun_np 2 "$TRAIN04" $FLAGS $v --out "$d/v" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS $v --tp 2 --out "$d/vtp" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS $v --out "$d/vdp" >/dev/null
    for run_dir in "$d/v" "$d/vtp" "$d/vdp"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
    "$TRAIN01" $FLAGS --precision bf16 --out "$d/01-bf16" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS $v --precision bf16 --out "$d/vbf16" >/dev/null
    assert_losses_within "$d/01-bf16" "$d/vbf16" 4 1e-2
    assert_norms_match "$d/01-bf16" "$d/vbf16" 1e-3
    mpirun_np 2 "$TRAIN04" $FLAGS $v --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$REF" "$d/one" 1e-5
}

@test "tied embeddings: 04 on 3 stages, and on 2 stages x 2 replicas (naive all-reduce), give 01's losses" {
    mpirun_np 3 "$TRAIN04" $FLAGS --pp 3 --micro 2 --out "$(scratch)/pp3" >/dev/null
    assert_losses_match "$REF" "$(scratch)/pp3" 4
    mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --dp-mode naive --out "$(scratch)/pp2dp2" >/dev/null
    assert_losses_match "$REF" "$(scratch)/pp2dp2" 4
    assert_norms_match "$REF" "$(scratch)/pp2dp2"
}

@test "tied embeddings: 04 on 2 stages x tp 2 (1F1B, ZB-H1) and on pp 2 x tp 2 x dp 2 gives 01's losses and norms" {
    for schedule in 1f1b zb-h1; do
        mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --tp 2 --micro 2 --schedule $schedule --out "$(scratch)/$schedule" >/dev/null
        assert_losses_match "$REF" "$(scratch)/$schedule" 4
        assert_norms_match "$REF" "$(scratch)/$schedule"
    done
    mpirun_np 8 "$TRAIN04" $FLAGS --pp 2 --tp 2 --out "$(scratch)/3d" >/dev/null
    assert_losses_match "$REF" "$(scratch)/3d" 4
}

@test "tied embeddings: 05 and 06 on 2 stages without ZeRO (04's pipeline) give 01's losses" {
    mpirun_np 2 "$TRAIN05" $FLAGS --pp 2 --zero 0 --out "$(scratch)/z0" >/dev/null
    assert_losses_match "$REF" "$(scratch)/z0" 4
    mpirun_np 2 "$TRAIN06" $FLAGS --pp 2 --zero 0 --out "$(scratch)/z0_06" >/dev/null
    assert_losses_match "$REF" "$(scratch)/z0_06" 4
}

# ZeRO and the offload on stages (tied_ends.h): the first stage's shards own
# wte; the last stage's head reads a copy, refreshed after every update, and
# its gradient of wte, reduce-scattered over the last stage's replicas, is
# added into the first stage's slices before the norm. Without that sum the
# norm of step 1 is far from 01's; without the refresh the losses part from
# step 2 on.
@test "tied embeddings: 05 ZeRO 1 and 2 on stages (2, 3, ZB-H1 with micro-batches, 2 replicas, 3 replicas with padding, --cp 2) give 01's losses and norms; a checkpoint resumes in 01, and 01's in them" {
    local d="$(scratch)" run_dir
    mpirun_np 2 "$TRAIN05" $FLAGS --pp 2 --zero 1 --out "$d/z1" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --pp 2 --zero 2 --out "$d/z2" >/dev/null
    mpirun_np 3 "$TRAIN05" $FLAGS --pp 3 --zero 1 --micro 2 --out "$d/pp3" >/dev/null
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --zero 2 --micro 2 --schedule zb-h1 --out "$d/zb" >/dev/null
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --cp 2 --zero 2 --out "$d/cp" >/dev/null
    for run_dir in "$d/z1" "$d/z2" "$d/pp3" "$d/zb" "$d/cp"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
    # 3 replicas: the embedding unit padded to a multiple of 3 on both ends
    "$TRAIN01" $FLAGS --batch 6 --out "$d/ref6" >/dev/null
    mpirun_np 6 "$TRAIN05" $FLAGS --batch 6 --pp 2 --dp 3 --zero 2 --out "$d/dp3" >/dev/null
    assert_losses_match "$d/ref6" "$d/dp3" 4
    assert_norms_match "$d/ref6" "$d/dp3"
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --zero 2 --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$REF" "$d/one" 1e-5
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --pp 2 --zero 1 --resume "$d/ck01" --out "$d/two" >/dev/null
    assert_resumed_match "$REF" "$d/two" 1e-5
}

@test "tied embeddings: 06 --offload on 2 stages (1F1B, ZB-H1 x 2 replicas) and 06 --zero 2 on 2 stages give 01's losses and norms, --dpu one stage's; an offloaded checkpoint resumes in 01, and 01's in the offload" {
    local d="$(scratch)" run_dir
    mpirun_np 2 "$TRAIN06" $FLAGS --pp 2 --offload --out "$d/off" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --offload --micro 2 --schedule zb-h1 --out "$d/offzb" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --zero 2 --out "$d/z2" >/dev/null
    for run_dir in "$d/off" "$d/offzb" "$d/z2"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
    # the delayed update installs wte a step late, and the copy follows it (and a save's finished update)
    "$TRAIN06" $FLAGS --offload --dpu --save "$d/ck1" --save-every 2 --out "$d/dpu1" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --pp 2 --offload --dpu --save "$d/ck2" --save-every 2 --out "$d/dpu2" >/dev/null
    assert_losses_match "$d/dpu1" "$d/dpu2" 4
    assert_norms_match "$d/dpu1" "$d/dpu2"
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --offload --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$REF" "$d/one" 1e-5
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --pp 2 --offload --resume "$d/ck01" --out "$d/two" >/dev/null
    assert_resumed_match "$REF" "$d/two" 1e-5
}

# With --tp each tensor rank of the last stage keeps its rows of wte (the
# vocabulary split) and exchanges them with its counterpart on the first
# stage, whose shards are of the same slices.
@test "tied embeddings: ZeRO 1 and 2 and --offload on 2 stages of --tp 2 (ZB-H1 x 2 replicas, --sp, bf16) give 01's losses and norms; a checkpoint resumes in 01" {
    local d="$(scratch)" run_dir
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --tp 2 --zero 1 --out "$d/z1" >/dev/null
    mpirun_np 8 "$TRAIN05" $FLAGS --pp 2 --tp 2 --zero 2 --micro 2 --schedule zb-h1 --out "$d/z2" >/dev/null
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --tp 2 --sp --zero 2 --out "$d/sp" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --tp 2 --offload --out "$d/off" >/dev/null
    for run_dir in "$d/z1" "$d/z2" "$d/sp" "$d/off"; do
        assert_losses_match "$REF" "$run_dir" 4
        assert_norms_match "$REF" "$run_dir"
    done
    "$TRAIN01" $FLAGS --precision bf16 --out "$d/01-bf16" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --tp 2 --offload --precision bf16 --out "$d/offbf16" >/dev/null
    assert_losses_within "$d/01-bf16" "$d/offbf16" 4 1e-4
    assert_norms_match "$d/01-bf16" "$d/offbf16" 1e-3
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --tp 2 --zero 2 --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$REF" "$d/one" 1e-5
}

@test "tied embeddings in 16 bits on ZeRO's and the offload's stages: 05 ZeRO 1 (bf16, 2 replicas) and 2 (fp16, micro-batches), 06 --offload (bf16, 2 replicas) on 2 stages give 01's in the same precision; a bf16 checkpoint resumes in 01" {
    local d="$(scratch)" p run_dir
    for p in bf16 fp16; do "$TRAIN01" $FLAGS --precision $p --out "$d/01-$p" >/dev/null; done
    mpirun_np 4 "$TRAIN05" $FLAGS --pp 2 --zero 1 --precision bf16 --out "$d/z1" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --pp 2 --zero 2 --precision fp16 --micro 2 --out "$d/z2" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --offload --precision bf16 --out "$d/off" >/dev/null
    for run_dir in "bf16,$d/z1" "fp16,$d/z2" "bf16,$d/off"; do
        assert_losses_within "$d/01-${run_dir%%,*}" "${run_dir#*,}" 4 1e-4
        assert_norms_match "$d/01-${run_dir%%,*}" "${run_dir#*,}" 1e-3
    done
    mpirun_np 2 "$TRAIN06" $FLAGS --pp 2 --offload --precision bf16 --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --precision bf16 --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$d/01-bf16" "$d/one" 1e-4
}

# The head's gradient of wte (mixed.h: tied_dwte) is a large part of the
# whole gradient: without it the norm of step 1 is far from fp32's.
@test "tied embeddings in 16 bits: 01 bf16 and fp16 follow 01 fp32 (losses and norms within 1e-2), and 02 on 2 ranks, 03/04 tensor parallel, ZeRO-1 in 05 and 06, ZeRO-2 and 3 in 05 and 06 --offload give 01's in the same precision" {
    local d="$(scratch)" p
    for p in bf16 fp16; do
        "$TRAIN01" $FLAGS --precision $p --out "$d/01-$p" >/dev/null
        assert_losses_within "$REF" "$d/01-$p" 4 1e-2
        assert_norms_match "$REF" "$d/01-$p" 1e-2
    done
    mpirun_np 2 "$TRAIN02" $FLAGS --precision fp16 --out "$d/02" >/dev/null
    assert_losses_within "$d/01-fp16" "$d/02" 4 1e-2
    mpirun_np 2 "$TRAIN03" $FLAGS --mp tensor --precision bf16 --out "$d/03" >/dev/null
    assert_losses_within "$d/01-bf16" "$d/03" 4 1e-2
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 1 --tp 2 --precision bf16 --out "$d/04" >/dev/null
    assert_losses_within "$d/01-bf16" "$d/04" 4 1e-2
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 1 --precision fp16 --out "$d/05" >/dev/null
    assert_losses_within "$d/01-fp16" "$d/05" 4 1e-2
    mpirun_np 2 "$TRAIN06" $FLAGS --zero 1 --precision bf16 --out "$d/06" >/dev/null
    assert_losses_within "$d/01-bf16" "$d/06" 4 1e-2
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 2 --precision bf16 --out "$d/05z2" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --precision fp16 --out "$d/05z3" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --offload --precision bf16 --out "$d/06off" >/dev/null
    local run_dir
    for run_dir in "$d/01-bf16,$d/05z2" "$d/01-fp16,$d/05z3" "$d/01-bf16,$d/06off"; do
        assert_losses_within "${run_dir%,*}" "${run_dir#*,}" 4 1e-2
        assert_norms_match "${run_dir%,*}" "${run_dir#*,}" 1e-2
    done
}

@test "a tied checkpoint of 05 --zero 3, of 06 --zero 2 and of 06 --offload resumes in 01 with 01's losses" {
    local d="$(scratch)" run_dir
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --stop-after 2 --save "$d/ck3" --out "$d/first3" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck3" --out "$d/one3" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --zero 2 --stop-after 2 --save "$d/ck2" --out "$d/first2" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck2" --out "$d/one2" >/dev/null
    mpirun_np 2 "$TRAIN06" $FLAGS --offload --stop-after 2 --save "$d/ckoff" --out "$d/firstoff" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ckoff" --out "$d/oneoff" >/dev/null
    for run_dir in "$d/one3" "$d/one2" "$d/oneoff"; do
        assert_resumed_match "$REF" "$run_dir" 1e-5
    done
}

# The last stage's 16-bit copy of the embedding unit takes the head's gradient
# of wte (mixed.h: tied_dwte) and the two ends sum theirs in 16 bits: without
# it the norms drift from 01's by a percent or more.
@test "tied embeddings in 16 bits on several stages: 04 on 2 stages (bf16; fp16 ZB-H1 with 2 micro-batches), 3 stages, 2 stages x tp 2, 2 stages x 2 replicas, and 03's layer split (bf16 on 2, fp16 on 3 stages) give 01's in the same precision" {
    local d="$(scratch)" p run_dir
    for p in bf16 fp16; do "$TRAIN01" $FLAGS --precision $p --out "$d/01-$p" >/dev/null; done
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --precision bf16 --out "$d/pp2" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --precision fp16 --micro 2 --schedule zb-h1 --out "$d/zb" >/dev/null
    mpirun_np 3 "$TRAIN04" $FLAGS --pp 3 --precision bf16 --out "$d/pp3" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --tp 2 --precision bf16 --out "$d/pptp" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --dp-mode naive --precision bf16 --out "$d/ppdp" >/dev/null
    mpirun_np 2 "$TRAIN03" $FLAGS --mp layer --precision bf16 --out "$d/l2" >/dev/null
    mpirun_np 3 "$TRAIN03" $FLAGS --mp layer --precision fp16 --micro 2 --out "$d/l3" >/dev/null
    for run_dir in "bf16,$d/pp2" "fp16,$d/zb" "bf16,$d/pp3" "bf16,$d/pptp" "bf16,$d/ppdp" "bf16,$d/l2" "fp16,$d/l3"; do
        assert_losses_within "$d/01-${run_dir%%,*}" "${run_dir#*,}" 4 1e-2
        assert_norms_match "$d/01-${run_dir%%,*}" "${run_dir#*,}" 1e-3
    done
    # a checkpoint of the 2 stages in bf16 resumes in 01 with its losses
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --precision bf16 --stop-after 2 --save "$d/ck" --out "$d/first" >/dev/null
    "$TRAIN01" $FLAGS --precision bf16 --resume "$d/ck" --out "$d/one" >/dev/null
    assert_resumed_match "$d/01-bf16" "$d/one" 1e-4
}

@test "a tied checkpoint of 04's 2 stages (tp 1 and 2) resumes in 01, and 01's in 04's 2 stages, with 01's losses" {
    local d
    d="$(scratch)"
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --stop-after 2 --save "$d/ck04" --out "$d/first04" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck04" --out "$d/one" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --tp 2 --stop-after 2 --save "$d/ck04tp" --out "$d/first04tp" >/dev/null
    "$TRAIN01" $FLAGS --resume "$d/ck04tp" --out "$d/one_tp" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --resume "$d/ck01" --out "$d/two" >/dev/null
    mpirun_np 4 "$TRAIN04" $FLAGS --pp 2 --tp 2 --resume "$d/ck01" --out "$d/two_tp" >/dev/null
    for run_dir in "$d/one" "$d/one_tp" "$d/two" "$d/two_tp"; do
        assert_resumed_match "$REF" "$run_dir" 1e-5
    done
}

@test "a tied checkpoint resumes in 02 with 01's losses, and is refused by an untied run, and an untied one by a tied run" {
    local d
    d="$(scratch)"
    "$TRAIN01" $FLAGS --stop-after 2 --save "$d/tied" --out "$d/first" >/dev/null
    run "$REPO/common/ckpt" "$d/tied"
    assert_line --regexp "^model       layers 4, dmodel 64, heads 4, seq 64, vocab 256, tied embeddings: "
    mpirun_np 2 "$TRAIN02" $FLAGS --resume "$d/tied" --out "$d/resumed" >/dev/null
    assert_resumed_match "$REF" "$d/resumed" 1e-5
    run --separate-stderr "$TRAIN01" ${FLAGS/--tie-embeddings/} --resume "$d/tied" --out "$d/o"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --resume $d/tied: written with tied embeddings; this run lacks --tie-embeddings (valid: the same as the run that wrote it)"
    "$TRAIN01" ${FLAGS/--tie-embeddings/} --stop-after 2 --save "$d/untied" --out "$d/first_untied" >/dev/null
    run --separate-stderr "$TRAIN01" $FLAGS --resume "$d/untied" --out "$d/o"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --resume $d/untied: written without tied embeddings; this run has --tie-embeddings (valid: the same as the run that wrote it)"
}

@test "GPT-2's vocabulary, 50257 padded to 50304, tied, on a token shard: 02 on 2 ranks and 04 on 2 stages give 01's losses" {
    local d
    d="$(scratch)"
    # llm.c's shard format: ids over the whole vocabulary, the last one (50256, <|endoftext|>) too
    python3 -c 'import random, struct, sys
r = random.Random(39); n = 20000
t = [r.randrange(50257) for _ in range(n - 1)] + [50256]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *[0] * 253) + struct.pack("<%dH" % n, *t))' "$d/s.bin"
    local gpt2="--device cpu --layers 2 --steps 3 --batch 4 --seq 32 --sample 0 --quiet --vocab 50257 --tie-embeddings --data $d/s.bin"
    "$TRAIN01" $gpt2 --out "$d/ref" >/dev/null
    mpirun_np 2 "$TRAIN02" $gpt2 --out "$d/dp2" >/dev/null
    assert_losses_match "$d/ref" "$d/dp2" 3
    mpirun_np 2 "$TRAIN04" $gpt2 --pp 2 --out "$d/pp2" >/dev/null
    assert_losses_match "$d/ref" "$d/pp2" 3
    # the head's 50304 x 64 rows are wte's: parameters = (50304 + 32) x 64 + 2 blocks + ln_f
    assert_equal "$(csv_column "$d/ref/run.csv" params)" $(((50304 + 32) * 64 + 2 * 49984 + 128))
}
