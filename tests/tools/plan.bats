#!/usr/bin/env bats
# common/plan predicts a run's memory.csv without running it, by dry runs of
# the chapter's own program (plan_dry.h: `NN/train --dry-run --world N --rank
# R`, one per distinct rank): for each layout below the planner's --csv equals
# the program's memory.csv line for line (every rank, space and category,
# exact), its bytes sent per step equal what the run counted, and every
# rank's together on each grid axis run.csv's bytes_{dp,pp,cp,tp,ep}_per_step.
# The model splits' bytes are also held rank by rank to the formulas, written
# again from the model's shape (plan_sent.py), and a planted allocation and
# message (COURSE_FAULT_PLANT) show that the plan follows the program with no
# change to the planner. The papers' numbers come out of its formula mode.
#
# Shown to fail: with the dry ranks started without the planted variable
# (unsetenv in plan_dry.c), the planted test failed on device,comm (0 planned,
# 4096 measured); with steps.csv's empty val_loss field skipped when reading
# 06's copies (strtok), both 06 tests failed on the PCIe bytes (821760
# planned, 547840 measured); with the dry run's closing sample not run, the
# --cp tests failed on device,workspace (911360 planned, 912384 measured: the
# sample's forward grows the attention workspace); with 06's offloaded
# checkpoints given one layer more in a dry run, the --offload-activations
# test failed on host,activations (327680 planned, 262144 measured); with
# --offload-params' copies of units left uncounted in a dry run, its test
# failed on the PCIe bytes.

load ../helpers

PLAN="$REPO/common/plan"
FLAGS="--device cpu --model tiny --steps 2 --eval-batches 1 --sample 16 --quiet"
# A shape whose units do not divide by 2 or 3 ranks (zero.bats's): padding in every shard.
ODD="--dmodel 48 --heads 4 --vocab 259"

# planned NP PROGRAM ARGS...: run PROGRAM on NP ranks (one thread each) with
# ARGS, plan the same command line, and compare memory.csv with the plan's
# --csv line for line; leaves the run in $RUN and the plan's output in $output.
planned() {
    local np="$1" program="$2" chapter
    shift 2
    chapter="${program%%_*}"
    RUN="$(scratch)/$chapter-$np-$BATS_TEST_NUMBER-$RANDOM"
    if [ "$np" = 1 ]; then
        OMP_NUM_THREADS=1 "$REPO/$program" $FLAGS "$@" --out "$RUN" >"$RUN.log"
    else
        OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/$program" $FLAGS "$@" --out "$RUN" >"$RUN.log"
    fi
    run env OMP_NUM_THREADS=1 "$PLAN" $FLAGS "$@" --chapter "$chapter" --dp "$np" --out "$RUN" --csv "$RUN/plan.csv"
    assert_success
    local plan_output="$output"
    run diff "$RUN/plan.csv" "$RUN/memory.csv"
    assert_success
    output="$plan_output"
}

# planned_split NP PROGRAM "PLAN FLAGS" ARGS...: planned's check for a model
# split (chapters 03-05 with stages or tensor slices), whose ranks differ: the
# program runs on NP ranks with ARGS, the planner with ARGS and PLAN FLAGS
# (03's stages as --pp: the program takes them from the rank count).
planned_split() {
    local np="$1" program="$2" plan_flags="$3" chapter
    shift 3
    chapter="${program%%_*}"
    RUN="$(scratch)/$chapter-$np-$BATS_TEST_NUMBER-$RANDOM"
    OMP_NUM_THREADS=1 mpirun_np "$np" "$REPO/$program" $FLAGS "$@" --out "$RUN" >/dev/null
    run env OMP_NUM_THREADS=1 "$PLAN" $FLAGS "$@" $plan_flags --chapter "$chapter" --out "$RUN" --csv "$RUN/plan.csv"
    assert_success
    local plan_output="$output"
    run diff "$RUN/plan.csv" "$RUN/memory.csv"
    assert_success
    output="$plan_output"
}

# sent_matches: the plan's bytes sent per step (its first "(sum)" of bytes
# sent: rank 0's, whose count run.csv keeps) against run.csv's
# bytes_sent_per_step, within a byte (run.csv prints whole bytes); 06 also
# its host-device copies against pcie_bytes_per_step.
sent_matches() {
    local predicted measured
    predicted="$(awk '/^bytes each rank sends|bytes sent per step/ { on = 1 } on && $1 == "(sum)" { print $2; exit }' <<<"$output")"
    measured="$(csv_column "$RUN/run.csv" bytes_sent_per_step)"
    awk -v p="$predicted" -v m="$measured" 'BEGIN { d = p - m; if (d < 0) d = -d; if (d > 1) { print "sent: planned " p ", measured " m; exit 1 } }'
    if [ "$(csv_column "$RUN/run.csv" pcie_bytes_per_step)" != "" ]; then
        predicted="$(awk '$1 == "device" && $2 == "to" && d == "" { d = $4 } $1 == "host" && $2 == "to" && h == "" { h = $4 } END { print d + h }' <<<"$output")"
        measured="$(csv_column "$RUN/run.csv" pcie_bytes_per_step)"
        [ "$predicted" = "$measured" ] || { echo "pcie: planned $predicted, measured $measured"; return 1; }
    fi
}

# axes_match: after `planned` or `planned_split`, the plan's bytes sent per
# step on each grid axis, every rank's together ("axis dp N" ...), against
# run.csv's bytes_{dp,pp,cp,tp,ep}_per_step (harness.h's run_axis_columns,
# which 02, 03 and 04 write; ep: 03's expert parallelism), within a byte
# (run.csv prints whole bytes).
axes_match() {
    local axis planned measured
    for axis in dp pp cp tp ep; do
        planned="$(awk -v a="$axis" '$1 == "axis" && $2 == a { print $3 }' <<<"$output")"
        measured="$(csv_column "$RUN/run.csv" "bytes_${axis}_per_step")"
        awk -v p="$planned" -v m="$measured" -v a="$axis" 'BEGIN { d = p - m; if (d < 0) d = -d
            if (p == "" || m == "" || d > 1) { print a ": planned " p ", measured " m; exit 1 } }'
    done
}

# ring_sent_matches NP BYTES_PER_ELEMENT: after `planned` of 02 --allreduce
# ring, the plan's bytes sent per step (rank 0's) against ring.c's chunk
# sends written again: per all-reduce of c elements (the whole gradient, the
# run's "N parameters"; with --print-buckets each bucket [lo, hi) it printed)
# in NP balanced chunks (c/NP, one more for the first c%NP), rank 0 passes
# on chunks -s (reduce-scatter) and 1-s (all-gather) mod NP at steps
# s = 0..NP-2. 02 writes no bytes_sent_per_step; the closing line's MiB are too coarse.
ring_sent_matches() {
    local np="$1" eb="$2" predicted formula
    predicted="$(awk '$1 == "(sum)" { print $2; exit }' <<<"$output")"
    formula="$(awk -v n="$np" -v eb="$eb" '
        function len(c, k) { k = (k % n + n) % n; return int(c / n) + (k < c % n ? 1 : 0) }
        function sends(c, s, e) { e = 0; for (s = 0; s < n - 1; s++) e += len(c, -s) + len(c, 1 - s); return e }
        / parameters \| / { for (i = 1; i < NF; i++) if ($(i + 1) == "parameters") whole = $i }
        $1 ~ /^[0-9]+$/ && $2 == "[" { lo = $3; sub(",", "", lo); hi = $4; sub("\\)", "", hi); e += sends(hi - lo); buckets++ }
        END { if (!buckets) e = sends(whole); printf "%.0f\n", e * eb }' "$RUN.log")"
    [ "$predicted" = "$formula" ] || { echo "ring: planned $predicted, formula $formula"; return 1; }
}

@test "01 in fp32 and bf16, with recompute and micro-batches: the plan is memory.csv" {
    planned 1 01_single_gpu/train
    planned 1 01_single_gpu/train --precision bf16
    planned 1 01_single_gpu/train --recompute --micro 2
    planned 1 01_single_gpu/train --precision fp16 --recompute $ODD
}

@test "GPT-2's vocabulary padded and tied, in 01, 02 on 2 ranks, 03 tensor parallel, 05 --zero 1, 2 and 3 and 06 --offload: the plan is memory.csv" {
    local gpt2="--vocab 50257 --tie-embeddings --batch 4"
    planned 1 01_single_gpu/train $gpt2
    planned 2 02_data_parallel/train $gpt2 --dp-mode overlap
    axes_match
    planned_split 2 03_model_parallel/train "--tp 2" --mp tensor $gpt2
    planned 2 05_zero/train --zero 1 $gpt2
    planned 2 05_zero/train --zero 2 $gpt2
    axes_match
    planned 2 05_zero/train --zero 3 $gpt2
    axes_match
    planned 2 06_offload/train --offload --precision bf16 $gpt2
    axes_match
}

# The last stage's copy of the embedding unit (04's pipeline.h) in params,
# grads and AdamW's state, the first and last stages' buffer for the other
# end's gradient, and the exchange of that gradient on the pp axis.
@test "tied embeddings over 04's stages (2 and 3, with replicas, naive and flat, with tp, in bf16, interleaved) and 03's layer split: the plan is memory.csv, its pp bytes run.csv's" {
    local tied="--vocab 300 --tie-embeddings --batch 8 --micro 2"
    planned_split 2 04_pipeline/train "--pp 2" --pp 2 $tied
    axes_match
    planned_split 3 04_pipeline/train "--pp 3" --pp 3 --layers 3 --schedule zb-h1 $tied
    axes_match
    planned_split 4 04_pipeline/train "--pp 2 --dp 2" --pp 2 --dp-mode naive $tied
    axes_match
    planned_split 4 04_pipeline/train "--pp 2 --tp 2" --pp 2 --tp 2 $tied
    axes_match
    planned_split 2 04_pipeline/train "--pp 2" --pp 2 --precision bf16 $tied
    axes_match
    planned_split 2 04_pipeline/train "--pp 2" --pp 2 --layers 4 --virtual 2 --schedule interleaved $tied
    axes_match
    planned_split 2 03_model_parallel/train "--pp 2" --mp layer $tied
    axes_match
    planned_split 2 03_model_parallel/train "--pp 2" --mp layer --precision bf16 $tied
}

# ZeRO's and the offload's stages (tied_ends.h): the first stage's shards own
# wte; the last stage holds a copy, the head's gradient of wte and the padded
# unit it is reduce-scattered in; a slice and wte cross the pp axis each step.
@test "tied embeddings over 05's and 06's stages (ZeRO 1 and 2, bf16, with replicas, with tp; --offload, 16 bits, --dpu): the plan is memory.csv, its pp bytes run.csv's" {
    local tied="--vocab 300 --tie-embeddings --batch 8 --micro 2"
    planned_split 2 05_zero/train "" --zero 1 --pp 2 $tied
    axes_match
    planned_split 4 05_zero/train "" --zero 2 --pp 2 --dp 2 --precision bf16 $tied
    axes_match
    planned_split 4 06_offload/train "" --offload --pp 2 --dp 2 --precision bf16 $tied
    axes_match
    sent_matches
    planned_split 2 06_offload/train "" --offload --pp 2 --dpu $tied
    axes_match
    planned_split 8 05_zero/train "" --zero 2 --pp 2 --tp 2 --dp 2 $tied
    axes_match
}

@test "02 on 2 and 3 ranks, fp32 and bf16, flat and overlap: the plan is memory.csv on every rank, its dp bytes run.csv's" {
    planned 2 02_data_parallel/train
    axes_match
    planned 3 02_data_parallel/train --batch 12 --precision bf16
    axes_match
    planned 3 02_data_parallel/train --batch 12 --dp-mode overlap $ODD
    axes_match
}

# 02_data_parallel/ring.c's "ring all-reduce chunk": count / n + 1 elements of
# the largest all-reduce (16 bits: and as many floats), in the comm row.
@test "02 --allreduce ring on 2 and 3 ranks, flat and overlap, fp32 and bf16: the plan is memory.csv, the bytes ring.c's chunks and run.csv's" {
    planned 2 02_data_parallel/train --allreduce ring
    axes_match
    ring_sent_matches 2 4
    planned 3 02_data_parallel/train --allreduce ring --batch 12 --precision bf16
    axes_match
    ring_sent_matches 3 2
    planned 3 02_data_parallel/train --allreduce ring --batch 12 --dp-mode overlap --bucket-mb 0.05 --print-buckets
    axes_match
    ring_sent_matches 3 4
    planned 2 02_data_parallel/train --allreduce ring --dp-mode overlap --bucket-mb 0.03 --precision bf16 \
        --print-buckets $ODD
    axes_match
    ring_sent_matches 2 2
}

# 03-05's replicas run the ring over the ranks holding the same weights (dp x
# cp in 03), each rank at its own place in it: the chunks it passes on differ
# by rank where the tensors do not divide (tiny's C = 64 over 3 or 6 ranks),
# so every rank's bytes together are run.csv's only with every place right.
@test "03-05 --allreduce ring over dp x cp, tp slices and stages, flat and naive: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 6 03_model_parallel/train "" --cp 2 --dp 3 --batch 12 --allreduce ring --dp-mode naive
    axes_match
    planned_split 4 03_model_parallel/train "" --mp tensor --tp 2 --dp 2 --allreduce ring --dp-mode naive --precision bf16
    axes_match
    planned_split 6 04_pipeline/train "" --pp 2 --dp 3 --batch 12 --micro 2 --allreduce ring --dp-mode naive
    axes_match
    planned_split 4 04_pipeline/train "" --layers 4 --pp 2 --dp 2 --micro 2 --schedule interleaved --virtual 2 \
        --allreduce ring --dp-mode naive
    axes_match
    planned_split 4 05_zero/train "" --zero 0 --pp 2 --dp 2 --allreduce ring --precision bf16
    axes_match
}

@test "05 at every ZeRO stage on 2 ranks, fp32: the plan is memory.csv, and the bytes sent are the run's" {
    for stage in 0 1 2 3; do
        planned 2 05_zero/train --zero $stage
        sent_matches
        axes_match
    done
}

@test "05 at every ZeRO stage on 3 ranks in bf16, units padded, 2 micro-batches: the plan is memory.csv" {
    for stage in 0 1 2 3; do
        planned 3 05_zero/train --zero $stage --precision bf16 --batch 12 --micro 2 $ODD
        sent_matches
    done
    planned 3 05_zero/train --zero 3 --prefetch 0 --batch 12 $ODD
}

# Five ranks, the odd shape (d 48: no unit divides by 5) and fp16: 02's replicas and ZeRO-3's
# padded shards, every rank's rows and the dp axis's bytes.
@test "5 ranks in fp16 at d 48: 02 and 05's ZeRO-3, the plan is memory.csv on every rank, its dp bytes run.csv's" {
    planned 5 02_data_parallel/train --batch 10 --precision fp16 $ODD
    axes_match
    planned 5 05_zero/train --zero 3 --batch 10 --precision fp16 $ODD
    sent_matches
}

@test "06 with --offload, with and without --dpu, fp32 and bf16: the plan is memory.csv, host rows too" {
    planned 2 06_offload/train --offload
    sent_matches
    axes_match
    planned 2 06_offload/train --offload --dpu --precision bf16
    sent_matches
    planned 1 06_offload/train --offload --precision bf16 --micro 2
    sent_matches
    planned 3 06_offload/train --offload --dpu --batch 12 --micro 2 $ODD
    sent_matches
}

@test "06 --offload --recompute --offload-activations, fp32 and bf16: the plan is memory.csv, the checkpoints on the host, its PCIe bytes run.csv's" {
    planned 1 06_offload/train --offload --recompute --offload-activations --layers 4 --micro 2
    sent_matches
    [ "$(awk -F, '$1 == 0 && $2 == "host" && $3 == "activations" { print $4 }' "$RUN/memory.csv")" -gt 0 ]
    planned 2 06_offload/train --offload --recompute --offload-activations --layers 4 --precision bf16
    sent_matches
}

@test "06 --offload --offload-params, fp32 and bf16 (with offloaded checkpoints, pp 2 x tp 2 under zb-h1, 3 replicas, tied, --dpu, and cp 2 x dp 2): the plan is memory.csv, two units' weights on the device, its PCIe bytes run.csv's" {
    planned 1 06_offload/train --offload --offload-params --layers 4 --micro 2
    sent_matches
    [ "$(awk -F, '$1 == 0 && $2 == "device" && $3 == "params" { print $4 }' "$RUN/memory.csv")" -lt \
        "$((4 * $(csv_column "$RUN/run.csv" params) / 2))" ]
    planned 1 06_offload/train --offload --offload-params --recompute --offload-activations --layers 4 --precision bf16
    sent_matches
    [ "$(awk -F, '$1 == 0 && $2 == "host" && $3 == "params" { print $4 }' "$RUN/memory.csv")" = \
        "$((2 * $(csv_column "$RUN/run.csv" params)))" ]
    planned_split 4 06_offload/train "" --offload --offload-params --pp 2 --tp 2 --micro 2 --schedule zb-h1 --precision bf16
    sent_matches
    planned 3 06_offload/train --offload --offload-params --precision bf16 --micro 2 --batch 12 $ODD
    sent_matches
    planned 2 06_offload/train --offload --offload-params --tie-embeddings --precision bf16 --batch 12 $ODD
    sent_matches
    planned 2 06_offload/train --offload --offload-params --dpu --precision bf16 --batch 12 $ODD
    sent_matches
    planned_split 4 06_offload/train "" --offload --offload-params --cp 2 --dp 2 --precision bf16
    sent_matches
}

@test "06 --offload over tp slices, pp x tp x dp and under zb-h1, and 06 without --offload (05's program): the plan is memory.csv" {
    planned_split 4 06_offload/train "" --offload --tp 2 --dp 2 --dpu
    sent_matches
    planned_split 8 06_offload/train "" --offload --pp 2 --tp 2 --dp 2 --micro 2 --schedule gpipe --precision bf16
    sent_matches
    axes_match
    planned_split 4 06_offload/train "" --offload --pp 2 --dp 2 --layers 4 --micro 2 --schedule zb-h1
    sent_matches # the gradient copies after B and after W
    planned_split 4 06_offload/train "" --zero 1 --pp 2 --dp 2 --recompute
    planned 2 06_offload/train --zero 2 --precision bf16
}

@test "03 with --cp (the ring: the layer split, tp, replicas, 16 bits; Ulysses) and --mp tensor --sp: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 6 03_model_parallel/train "--pp 3" --cp 2 --layers 3 --micro 2 --precision bf16
    axes_match
    planned_split 4 03_model_parallel/train "" --mp tensor --tp 2 --cp 2 --recompute
    axes_match
    planned_split 4 03_model_parallel/train "" --cp 2 --dp 2 --seq 48 --precision fp16
    axes_match
    planned_split 4 03_model_parallel/train "" --mp tensor --tp 2 --dp 2 --sp --precision bf16
    axes_match
    # Ulysses' all-to-alls (the library's and the course's own) and its head-split buffers
    planned_split 4 03_model_parallel/train "" --cp 2 --dp 2 --seq 48 --cp-mode ulysses --alltoall pairwise
    axes_match
    planned_split 4 03_model_parallel/train "" --cp 4 --cp-mode ulysses --precision bf16
    axes_match
    # chapter 04 runs 03's ring inside its stages, and overlaps 02's buckets across its replicas:
    # the planner, unchanged, plans them as the program runs them
    planned_split 4 04_pipeline/train "" --pp 2 --cp 2 --micro 2
    axes_match
    planned_split 4 04_pipeline/train "" --pp 2 --cp 2 --micro 2 --cp-mode ulysses
    axes_match
    planned_split 4 04_pipeline/train "" --pp 2 --dp 2 --micro 2 --dp-mode overlap --bucket-mb 0.1
    axes_match
}

@test "03 with --ep (inside --dp 4, the library's and the pairwise all-to-all, bf16): the plan is memory.csv, its bytes per axis run.csv's, ep's the formula" {
    # shown to fail: with the ep group made by comm_split (not comm_split_by), the dry run
    # refused to say the group's members and the planner failed
    local moe="--experts 6 --top-k 2 --capacity-factor 1.25 --batch 12"
    planned_split 4 03_model_parallel/train "" $moe --dp 4 --ep 2
    axes_match
    # each rank plans (and holds) the dense weights and 3 of the 6 experts of each of the 2 MoE blocks
    # (an expert: 8C^2 + 5C elements, C = 64), 4 bytes each in fp32
    local params
    params=$(csv_column "$RUN/run.csv" params)
    assert_equal "$(awk -F, '$1 == 0 && $2 == "device" && $3 == "params" { print $4 }' "$RUN/plan.csv")" \
        $(((params - 2 * 3 * (8 * 64 * 64 + 5 * 64)) * 4))
    # 4 ranks x 2 MoE blocks x (4 all-to-alls of 243-row blocks of C = 64 floats, and the counts: 3 floats), N - 1 = 1
    assert_equal "$(awk '$1 == "axis" && $2 == "ep" { print $3 }' <<<"$output")" $((4 * 2 * (4 * 243 * 64 * 4 + 3 * 4)))
    planned_split 4 03_model_parallel/train "" $moe --dp 4 --ep 2 --alltoall pairwise --precision bf16
    axes_match
}

@test "03's layer split with --ep inside each stage's replicas (2 stages x dp 2): the plan is memory.csv, its bytes per axis run.csv's" {
    # shown to fail: before the layer split trained experts, 03 refused the layout and the planner with it
    local moe="--experts 4 --top-k 2 --capacity-factor 1 --batch 8 --micro 2"
    planned_split 4 03_model_parallel/train "--pp 2" $moe --mp layer --dp 2 --ep 2
    axes_match
    # each stage's MoE block's all-to-alls: their buffers in the plan, their bytes on the ep axis
    grep -q '^1,device,comm,[1-9]' "$RUN/plan.csv"
    [ "$(awk '$1 == "axis" && $2 == "ep" { print $3 }' <<<"$output")" -gt 0 ]
}

@test "03 --mp tensor --tp 2 --dp 2 and 04 --pp 2 --tp 2 with experts (held whole on every tp rank): the plan is memory.csv, its bytes per axis run.csv's" {
    # shown to fail: before tensor parallelism computed the experts, 03 and 04 refused the layouts
    planned_split 4 03_model_parallel/train "" --experts 4 --top-k 2 --capacity-factor 1 --mp tensor --tp 2 --dp 2 --batch 8
    axes_match
    planned_split 4 04_pipeline/train "" --experts 4 --top-k 2 --pp 2 --tp 2 --micro 2 --batch 8
    axes_match
}

@test "03 --mp tensor --tp 2 --dp 2 --ep 2 and 04 --pp 2 --tp 2 --dp 2 --ep 2 (each tp rank its replica's experts): the plan is memory.csv, its bytes per axis run.csv's" {
    # shown to fail: while --ep refused tensor parallelism, the programs and the planner refused the layouts
    local moe="--experts 4 --top-k 2 --capacity-factor 1 --batch 8"
    planned_split 4 03_model_parallel/train "" $moe --mp tensor --tp 2 --dp 2 --ep 2
    axes_match
    [ "$(awk '$1 == "axis" && $2 == "ep" { print $3 }' <<<"$output")" -gt 0 ]
    planned_split 8 04_pipeline/train "" $moe --micro 2 --pp 2 --tp 2 --dp 2 --ep 2
    axes_match
    [ "$(awk '$1 == "axis" && $2 == "ep" { print $3 }' <<<"$output")" -gt 0 ]
}

@test "03 --mp tensor --tp 2 --sp with experts (and with --dp 2 --ep 2): the plan is memory.csv, its bytes per axis run.csv's" {
    # shown to fail: while --experts refused --sp, the programs and the planner refused the layouts
    local moe="--experts 4 --top-k 2 --capacity-factor 1 --batch 8"
    planned_split 2 03_model_parallel/train "" $moe --mp tensor --tp 2 --sp
    axes_match
    planned_split 4 03_model_parallel/train "" $moe --mp tensor --tp 2 --sp --dp 2 --ep 2
    axes_match
}

@test "04 with --ep inside each stage's replicas (pp 2 x dp 2, 1f1b): the plan is memory.csv, its bytes per axis run.csv's" {
    local moe="--experts 4 --top-k 2 --capacity-factor 1 --batch 8 --micro 2"
    planned_split 4 04_pipeline/train "" $moe --pp 2 --dp 2 --ep 2
    axes_match
    # the all-to-alls are in the plan: their buffers (device comm) and their bytes on the ep axis
    grep -q '^0,device,comm,[1-9]' "$RUN/plan.csv"
    [ "$(awk '$1 == "axis" && $2 == "ep" { print $3 }' <<<"$output")" -gt 0 ]
}

# Chapters 03-05's model splits, as their tests run them (model_parallel.bats,
# pipeline.bats, combined_layouts.bats): every rank's stage, slots and slices.
@test "03's layer split on 3 uneven stages in bf16, and tensor parallel tp 2 x dp 2 with recompute: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 3 03_model_parallel/train "--pp 3" --mp layer --layers 4 --precision bf16 --micro 2
    axes_match
    planned_split 4 03_model_parallel/train "" --mp tensor --tp 2 --dp 2 --batch 12 --recompute
    axes_match
}

@test "04's 1f1b with replicas, zb-h1, interleaved, and gpipe over pp 2 x tp 2 in bf16: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 4 04_pipeline/train "" --layers 4 --pp 2 --dp 2 --batch 16 --micro 4 --split 3,1 --schedule 1f1b
    axes_match
    planned_split 2 04_pipeline/train "" --layers 4 --pp 2 --micro 4 --schedule zb-h1
    axes_match
    planned_split 2 04_pipeline/train "" --layers 4 --pp 2 --micro 4 --schedule interleaved --virtual 2
    axes_match
    planned_split 4 04_pipeline/train "" --pp 2 --tp 2 --micro 2 --schedule gpipe --precision bf16
    axes_match
}

@test "05's ZeRO-1 and -2 inside pipeline stages (pp x dp, uneven, recompute): the plan is memory.csv" {
    planned_split 4 05_zero/train "" --zero 2 --pp 2 --dp 2 --micro 2
    planned_split 6 05_zero/train "" --zero 1 --pp 3 --dp 2 --layers 4 --split 2,1,1 --batch 12 --micro 2 \
        --schedule gpipe --recompute
    # zb-h1: B's and W's calls each reduce-scatter (zero.h); every rank's collectives over dp, both
    # stages' plans times the 2 replicas, are run.csv's bytes_dp_per_step
    planned_split 4 05_zero/train "" --zero 2 --pp 2 --dp 2 --layers 4 --micro 2 --schedule zb-h1
    assert_equal "$(awk '$1 == "reduce-scatter" || $1 == "all-gather" { s += $2 } END { print 2 * s }' <<<"$output")" \
        "$(csv_column "$RUN/run.csv" bytes_dp_per_step)"
    axes_match
}

@test "04's interleaved and zb-h1 over pp 2 x tp 2, in bf16 with recompute: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 4 04_pipeline/train "" --layers 4 --pp 2 --tp 2 --micro 4 --schedule interleaved --virtual 2 \
        --precision bf16 --recompute
    axes_match
    planned_split 4 04_pipeline/train "" --layers 3 --pp 2 --tp 2 --micro 2 --schedule zb-h1 --precision bf16 \
        --recompute
    axes_match
}

@test "05's ZeRO-1 and -2 over tensor slices and pp x tp x dp, in 16 bits: the plan is memory.csv, its bytes per axis run.csv's" {
    planned_split 4 05_zero/train "" --zero 1 --tp 2 --dp 2 --precision bf16
    axes_match
    planned_split 8 05_zero/train "" --zero 2 --pp 2 --tp 2 --dp 2 --micro 2 --precision bf16
    axes_match
    planned_split 6 05_zero/train "" --zero 1 --pp 2 --dp 3 --batch 12 --precision fp16 --recompute $ODD
    axes_match
}

# The model splits' bytes sent per step. Rank by rank, chapters 03 and 04,
# and 05 with --pp, count no bytes per step of their own (only 05 with one
# stage and 06 write bytes_sent_per_step; 02-05 write each axis's, every
# rank's together: axes_match above), so each rank's plan is also held to
# the formula, written again here from the model's shape: a micro-batch of B sequences
# sends B x T x C fp32 values to each neighbouring piece (activations ahead,
# gradients back); a tensor group all-reduces B x T x C fp32 four times per
# block (and a fifth with --recompute, a sixth under zb-h1, whose W recomputes
# too), 2(tp-1)/tp of it each; replicas
# all-reduce what a rank holds once a step, 2(dp-1)/dp of it; 05's ZeRO-2
# reduce-scatters each unit's (N-1) slices every micro-batch, ZeRO-1 once,
# and all-gathers them once.
@test "the model splits' bytes sent per step, rank by rank, are the formulas" {
    split_sent() {
        run env OMP_NUM_THREADS=1 "$PLAN" --model tiny "$@"
        assert_success
        python3 "$REPO/tests/plan_sent.py" "$@" <<<"$output"
    }
    split_sent --chapter 03 --pp 3 --layers 4 --split 2,1,1 --micro 2
    split_sent --chapter 03 --mp tensor --tp 2 --dp 2 --recompute
    split_sent --pp 2 --layers 4 --split 1,1,1,1 --micro 4 --schedule interleaved --virtual 2
    split_sent --pp 2 --tp 2 --dp 2 --split 1,1 --micro 2
    split_sent --pp 2 --tp 2 --split 1,1 --micro 2 --schedule zb-h1 --recompute
    split_sent --chapter 05 --zero 2 --pp 2 --dp 2 --split 1,1 --micro 2
    split_sent --chapter 05 --zero 1 --pp 2 --dp 3 --split 1,1 --batch 12 --micro 2
    split_sent --chapter 05 --zero 2 --pp 2 --tp 2 --dp 2 --split 1,1 --micro 2 --precision bf16
    split_sent --chapter 05 --zero 1 --tp 2 --dp 3 --split 2 --batch 12
    split_sent --chapter 03 --cp 2 --pp 2 --dp 2 --split 1,1 --micro 2 --recompute
    split_sent --chapter 03 --mp tensor --tp 2 --cp 4
    split_sent --chapter 03 --mp tensor --tp 2 --dp 2 --sp --micro 2
}

# The plan is the program's own accounting: an allocation and a message
# planted in chapter 02's module through a test-only hook (util.h's
# COURSE_FAULT_PLANT: 4096 bytes of device comm memory, all-reduced over the
# replicas once a step) appear in the plan as in the run, the planner
# unchanged; without the hook the plan is the unplanted run's, not this one's.
@test "an allocation and a message planted in a chapter module are in the plan, with no change to the planner" {
    planned 2 02_data_parallel/train
    local comm_before="$(awk -F, '$1 == 0 && $3 == "comm" && $2 == "device" { print $4 }' "$RUN/memory.csv")"
    local dp_before="$(csv_column "$RUN/run.csv" bytes_dp_per_step)" unplanted_run="$RUN"
    export COURSE_FAULT_PLANT=4096
    planned 2 02_data_parallel/train
    unset COURSE_FAULT_PLANT
    axes_match
    assert_equal "$(awk -F, '$1 == 0 && $3 == "comm" && $2 == "device" { print $4 }' "$RUN/memory.csv")" \
        "$((comm_before + 4096))"
    assert_equal "$(csv_column "$RUN/run.csv" bytes_dp_per_step)" "$((dp_before + 2 * 4096))"
    # the same planner without the hook plans the run without it
    run env OMP_NUM_THREADS=1 "$PLAN" $FLAGS --chapter 02 --dp 2 --csv "$RUN/unplanted.csv"
    assert_success
    run diff "$RUN/unplanted.csv" "$RUN/memory.csv"
    assert_failure
    run diff "$RUN/unplanted.csv" "$unplanted_run/memory.csv"
    assert_success
}

@test "a layout the ranks cannot hold, or one not planned, is refused in one line with exit 2" {
    refused() {
        run --separate-stderr "$PLAN" "$@"
        assert_equal "$status" 2
        assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" 1
    }
    refused --dp 3
    [[ "$stderr" == *"--batch 8 is not divisible by 3 ranks x --micro 1 (valid: a multiple of 3)"* ]]
    refused --chapter 01 --dp 2
    refused --dp 2 --zero 3 --offload
    refused --chapter 02 --dp 2 --tp 2
    [[ "$stderr" == *"--tp is not a flag of 02_data_parallel/train (valid: the flags of its --help, or another --chapter)"* ]]
    refused --offload --pp 2 --layers 4 --micro 2 --schedule interleaved --virtual 2
    [[ "$stderr" == *"--schedule interleaved is refused by 06_offload/train: the offloaded state is one range of units per stage"* ]]
    refused --pp 2 --zero 3 --chapter 05
    refused --mp tensor --tp 3
    refused --pp 2 --schedule interleaved --micro 3 --batch 6
    refused --dp 2 --zero 1 --allreduce ring
    [[ "$stderr" == *"--allreduce is chapter 04's, for whole replicas; ZeRO keeps them here"* ]]
    refused --chapter 03 --cp 3
    [[ "$stderr" == *"--seq 64 cannot be cut into 2 x --cp 3 = 6 equal chunks"* ]]
    refused --chapter 03 --mp tensor --tp 2 --sp --cp 2
    refused --chapter 05 --pp 2 --layers 4 --micro 2 --schedule interleaved --virtual 2
    [[ "$stderr" == *"--virtual (interleaved chunks) with ZeRO is not written yet: a stage's shards are one range of units"* ]]
    refused --zero 4
    refused --dpu
    run "$PLAN" --help
    assert_success
    assert_output --partial "--csv FILE"
}

# The planner and the program refuse a layout in the same line: the rules are
# one piece of code the planner calls (common/run/layout_rules.h,
# common/model/layer_split.h), not a copy. same_refusal PROGRAM_ARGS -- PLAN_ARGS:
# the program's stderr line (one rank, or mpirun -np N first) equals the plan's.
same_refusal() {
    local program=() plan=()
    while [ "$1" != -- ]; do program+=("$1"); shift; done
    shift
    plan=("$@")
    run --separate-stderr timeout 20 bash -c "$(declare -f mpirun_np); \"\$@\"" _ "${program[@]}" $FLAGS \
        --out "$(scratch)/refused-$RANDOM"
    assert_equal "$status" 2
    local from_program="$(grep '^error:' <<<"$stderr" | sort -u)"
    run --separate-stderr "$PLAN" --model tiny "${plan[@]}"
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" 1
    assert_equal "$stderr" "$from_program"
}

@test "the planner refuses what 05 refuses in 05's own line: --schedule on ZeRO's one stage, --zero 3 over stages" {
    same_refusal "$REPO/05_zero/train" --zero 2 --schedule zb-h1 -- --chapter 05 --zero 2 --dp 2 --schedule zb-h1
    assert_equal "$stderr" "error: --schedule orders pipeline stages; with --pp 1 --tp 1 ZeRO runs its own one-stage step (valid: --schedule with --pp > 1 or --tp > 1)"
    same_refusal mpirun_np 2 "$REPO/05_zero/train" --zero 3 --pp 2 -- --chapter 05 --zero 3 --pp 2
    assert_equal "$stderr" "error: --zero 3 with --pp 2 is refused: every stage would re-gather its parameters for every micro-batch's forward and backward (DeepSpeed refuses it too; valid: --zero 0-2)"
    # 06 without --offload runs 05's rules, and accepts --prefetch at stage 3 as 05 does
    run "$PLAN" --model tiny --chapter 06 --dp 2 --zero 3 --prefetch 2
    assert_success
}

@test "the planner states the programs' --tp rule (whole heads, the MLP's 4 x dmodel) in the programs' words" {
    same_refusal mpirun_np 3 "$REPO/04_pipeline/train" --tp 3 -- --tp 3
    assert_equal "$stderr" "error: --tp 3 does not divide --heads 4: tensor parallelism gives every rank whole heads (valid: a divisor of the heads)"
}

@test "more pieces than layers, and a --split that does not name every chunk, are refused with what is valid, by 04 and the planner" {
    same_refusal mpirun_np 2 "$REPO/04_pipeline/train" --layers 6 --micro 2 --schedule interleaved --virtual 4 -- \
        --pp 2 --layers 6 --micro 2 --schedule interleaved --virtual 4
    assert_equal "$stderr" "error: --pp 2 x --virtual 4 = 8 pieces need at least 8 layers; the model has 6 (valid: --virtual 2..3 with --pp 2 here, every piece needs a block)"
    same_refusal mpirun_np 2 "$REPO/04_pipeline/train" --layers 4 --micro 2 --schedule interleaved --virtual 2 --split 2,1 -- \
        --pp 2 --layers 4 --micro 2 --schedule interleaved --virtual 2 --split 2,1
    assert_equal "$stderr" "error: --split 2,1 names 2 pieces but --pp 2 x --virtual 2 = 4 chunks need one number each (valid: 4 numbers, chunk by chunk in the model's order: chunk 0 of stages 0..1, then chunk 1, ...)"
    run --separate-stderr "$PLAN" --model tiny --pp 4
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --pp 4 stages for a model of 2 layers (valid: 1..2, every stage needs a block)"
}

@test "--offload-capacity refuses a reserve that leaves no device memory, naming the valid range" {
    run --separate-stderr "$PLAN" --offload-capacity --reserve 999G --gpu-mem 1G
    assert_equal "$status" 2
    assert_equal "$output" ""
    assert_equal "$stderr" "error: --reserve 1072668082176 bytes is not below --gpu-mem 1073741824: it leaves no memory for the model state (valid: --reserve 1..1073741823 bytes with this --gpu-mem)"
    run --separate-stderr "$PLAN" --offload-capacity --reserve 1G --gpu-mem 1G
    assert_equal "$status" 2
    run "$PLAN" --offload-capacity --reserve 1023M --gpu-mem 1G
    assert_success
    assert_line --partial "with offload (16-bit params on the device)        2      0.00B"
}

# The ZeRO paper (Rajbhandari et al., 2020), Figure 1: 7.5B parameters on 64
# devices, mixed-precision Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB a device.
@test "the ZeRO paper's model-state table: 120, 31.4, 16.6, 1.9 GB for 7.5B parameters on 64 GPUs" {
    run "$PLAN" --zero-table --params 7.5e9 --gpus 64
    assert_success
    assert_equal "$(awk '$2 ~ /^[0-3]$/ { printf "%s ", $NF }' <<<"$output")" "120.0 31.4 16.6 1.9 "
}

# The same figure from chapter 05's own accounting: a 7.46B-parameter GPT (35
# blocks of d 4096, GPT-2's padded vocabulary, untied) on 64 ranks in bf16,
# one dry run of rank 0 per stage: memory.csv's params, grads and optimizer
# rows (the fp32 master weights are the optimizer's) are the paper's formula
# for its P exactly (every unit divides by 64), and within 2% of the paper's
# 7.5B figures (0.5% fewer parameters). A 175B GPT-3-shaped model (96
# layers, d 12288, 96 heads, seq 2048) plans on 1,024 ranks (pp 32 x tp 32)
# in seconds: one dry run per stage.
@test "the ZeRO paper's Figure 1 from 05's own dry runs (7.46B on 64 ranks), and GPT-3 175B on 1,024 ranks, in seconds" {
    local start=$SECONDS
    run "$PLAN" --zero-table --gpus 64 --layers 35 --dmodel 4096 --heads 32 --seq 512 --vocab 50257 --batch 64
    assert_success
    assert_line --partial "7462490112 parameters on 64 devices, mixed-precision Adam"
    assert_equal "$(awk '$2 ~ /^[0-3]$/ { printf "%s ", $(NF - 1) }' <<<"$output")" "119.40 31.25 16.56 1.87 "
    run awk '$2 ~ /^[0-3]$/ { split("120 31.4 16.6 1.9", paper, " "); p = paper[$2 + 1]
        if ($(NF - 1) != $NF || $(NF - 1) / p < 0.98 || $(NF - 1) / p > 1.02) { print "stage " $2 ": " $0; bad = 1 } }
        END { exit bad }' <<<"$output"
    assert_success
    run "$PLAN" --chapter 04 --layers 96 --dmodel 12288 --heads 96 --seq 2048 --vocab 50257 --pp 32 --tp 32 \
        --batch 32 --micro 32
    assert_success
    assert_line --partial "1024 ranks = dp 1 x pp 32 x cp 1 x tp 32"
    assert_line --partial "175222972416 parameters"
    assert_line --partial "each stage's first rank ran"
    [ "$(grep -c '^rank [0-9]* (stage' <<<"$output")" = 32 ]
    [ $((SECONDS - start)) -lt 60 ]
}

# ZeRO-Offload (Ren et al., 2021): 13B parameters on one 32 GB V100 with
# offload, about 1.4B without. Assumed: 8 GiB of the 32 GiB hold what is not
# model state (activations, working buffers, fragmentation); without offload
# a parameter takes 16 bytes, and 18 with PyTorch DDP's gradient buckets (a
# second copy of the 16-bit gradients); with it 2 (chapter 06's device state).
@test "the ZeRO-Offload capacity claim: about 13B with offload on a 32 GB V100, about 1.4B without" {
    run "$PLAN" --offload-capacity --gpu-mem 32G --reserve 8G
    assert_success
    assert_line --partial "with offload (16-bit params on the device)        2     12.88B"
    assert_line --partial "without offload, DDP's gradient buckets too      18      1.43B"
    assert_line --partial "without offload (params, grads, Adam state)      16      1.61B"
}

# GPT-2 124M: 124,439,808 parameters with GPT-2's vocabulary of 50257 and the
# LM head tied to the embedding; llm.c pads the vocabulary to 50304 and
# prints num_parameters 124,475,904 (47 x 768 more rows of wte), and so does
# the course (model_config.h: vocab_padded), the same at 50257 and 50304.
# Untied, the course's GPT keeps its own LM head (V x 768 more). FLOPs per
# token: the course's 6P + 12LTC, and llm.c's count (gpt2_estimate_mfu: 6N +
# 6LCT, N tied).
@test "GPT-2 124M: llm.c's 124,475,904 parameters tied at vocab 50257 padded to 50304, and its FLOPs per token" {
    run "$PLAN" --model gpt2 --vocab 50257 --batch 1 --tie-embeddings
    assert_success
    assert_line "parameters 124475904 (the LM head tied to the embedding, as GPT-2 and llm.c)"
    run "$PLAN" --model gpt2 --vocab 50257 --batch 1
    assert_success
    assert_line "parameters 163109376 (124475904 with the LM head tied to the embedding, as GPT-2 and llm.c)"
    run "$PLAN" --model gpt2 --vocab 50304 --batch 1
    assert_success
    assert_line "parameters 163109376 (124475904 with the LM head tied to the embedding, as GPT-2 and llm.c)"
    # 6 x 163109376 + 12 x 12 x 1024 x 768; llm.c: 6 x 124475904 + 6 x 12 x 1024 x 768
    assert_line --partial "FLOPs per token 6P + 12LTC = 1091902464 (llm.c's count, tied, 6P + 6LTC: 803478528)"
}

# An MoE model (model_config.h: every --moe-every-th block's MLP made E experts
# and a router): the parameters are the program's (01's run.csv, and the hand
# count of the tiny shape: each MoE block E MLPs of 8C^2 + 5C and a router of
# E x C in place of one MLP), and the FLOPs per token 6A + 12LTC count what a
# token's step reads, A: every MoE block's top-K of its E experts, the router
# whole.
@test "an MoE model: the parameters are 01's own, and its FLOPs per token count each MoE block's top-k experts" {
    local dir n=0
    for moe in "--experts 8 --top-k 2" "--experts 4 --top-k 1 --moe-every 2" "--experts 6 --top-k 6"; do
        n=$((n + 1)) dir="$(scratch)/moe$n"
        # shellcheck disable=SC2086 # the words of $moe are flags
        OMP_NUM_THREADS=1 "$REPO/01_single_gpu/train" --model tiny --device cpu $moe --steps 1 --sample 0 --quiet \
            --dry-run --world 1 --rank 0 --out "$dir" >/dev/null
        # shellcheck disable=SC2086
        run "$PLAN" --model tiny $moe
        assert_success
        # shellcheck disable=SC2086
        run python3 - "$dir/run.csv" "$output" $moe <<'EOF'
import csv, sys
params = int(next(csv.DictReader(open(sys.argv[1])))["params"])
out, args = sys.argv[2].splitlines(), sys.argv[3:]
flag = lambda name, default: int(args[args.index(name) + 1]) if name in args else default
E, K, every = flag("--experts", 0), flag("--top-k", 1), flag("--moe-every", 1)
L, C, T, V = 2, 64, 64, 256
mlp = 8 * C * C + 5 * C  # fc (4C x C, 4C) and fcproj (C x 4C, C)
attn = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C  # ln1, qkv, proj, ln2
moe = [(l + 1) % every == 0 for l in range(L)]
P = V * C + T * C + sum(attn + (E * mlp + E * C if m else mlp) for m in moe) + 2 * C + V * C
A = P - sum(moe) * (E - K) * mlp
assert P == params, f"hand count {P}, run.csv {params}"
want = [f"parameters {params} ({params - V * C} with the LM head tied to the embedding, as GPT-2 and llm.c)",
        f"FLOPs per token 6A + 12LTC = {6 * A + 12 * L * T * C}, A = {A} parameters a token's step reads: "
        f"each MoE block's top-{K} of its {E} experts"]
for w in want:
    if not any(line.startswith(w) for line in out):
        sys.exit(f"{' '.join(args)}: no line '{w}' in the plan:\n" + "\n".join(out[:8]))
print(f"{' '.join(args)}: P {P}, A {A}")
EOF
        assert_success
    done
}
