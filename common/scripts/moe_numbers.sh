#!/bin/bash
# moe_numbers.sh: the numbers course.md's mixture-of-experts section cites, measured by
# chapter 01's own program (nothing computed by hand).
#
#   common/scripts/moe_numbers.sh SIZES_CSV DROPS_CSV
#
# SIZES_CSV  model,experts,top_k,params,flops_per_step,tokens_per_step
#            the small preset dense and with 8 experts, top-1 and top-2: params is the dry
#            run's run.csv, flops_per_step the sum of its dry-work.csv's flops (what the
#            kernels of one step of 8 sequences compute, forward and backward, AdamW left
#            out; dropless, so every choice is computed)
# DROPS_CSV  capacity_factor,aux_loss_coef,step,loss,aux_loss,dropped,choices
#            the tiny preset with 4 experts, top-2, trained 40 steps at capacity factor 1.0
#            with the default balancing coefficient 0.01 and with none, and dropless, on the
#            CPU and the frozen text tests/fixtures/text.txt (course.md, the default corpus,
#            changes with every edit): dropped is steps.csv's, choices = batch x seq x K x MoE
#            blocks (what dropped is out of)
#
# Each file is written only when new or an earlier output of this script (outputs.sh).
# Environment: TRAIN (default 01_single_gpu/train); OMP_NUM_THREADS (default 1: a thread count
# changes the order of float sums, and a near tie of the router's can go the other way).
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
. "$here/lib.sh"
. "$here/outputs.sh"
[ $# -eq 2 ] || { echo "usage: common/scripts/moe_numbers.sh SIZES_CSV DROPS_CSV" >&2; exit 2; }
SIZES_HEADER="model,experts,top_k,params,flops_per_step,tokens_per_step"
DROPS_HEADER="capacity_factor,aux_loss_coef,step,loss,aux_loss,dropped,choices"
output_file_check SIZES_CSV "$1" "a moe_numbers.sh sizes CSV" "moe_numbers.sh sizes CSV" "$SIZES_HEADER"
output_file_check DROPS_CSV "$2" "a moe_numbers.sh drops CSV" "moe_numbers.sh drops CSV" "$DROPS_HEADER"
sizes_out="$(cd "$(dirname -- "$1")" && pwd)/$(basename -- "$1")"
drops_out="$(cd "$(dirname -- "$2")" && pwd)/$(basename -- "$2")"
cd "$here/../.." # the repository: the program and the text by their paths from there
TRAIN="${TRAIN:-01_single_gpu/train}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
[ -x "$TRAIN" ] || { echo "moe_numbers.sh: $TRAIN is not built (run make)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

sizes="$work/sizes.csv"
echo "$SIZES_HEADER" >"$sizes"
for shape in "0 0" "8 1" "8 2"; do
    read -r E K <<<"$shape"
    moe=()
    [ "$E" -gt 0 ] && moe=(--experts "$E" --top-k "$K")
    out="$work/dry-$E-$K"
    "$TRAIN" --model small --batch 8 --dry-run --steps 1 ${moe[@]+"${moe[@]}"} --out "$out" >/dev/null
    flops=$(csv_awk '{ s += col("flops") } END { printf "%.0f", s }' "$out/dry-work.csv")
    tokens=$(( $(column "$out/run.csv" batch) * $(column "$out/run.csv" seq) ))
    echo "small,$E,$K,$(column "$out/run.csv" params),$flops,$tokens" >>"$sizes"
done

drops="$work/drops.csv"
echo "$DROPS_HEADER" >"$drops"
for run in "1.0 0.01" "1.0 0" "0 0.01"; do
    read -r F coef <<<"$run"
    out="$work/train-$F-$coef"
    "$TRAIN" --device cpu --data tests/fixtures/text.txt --model tiny --experts 4 --top-k 2 \
        --capacity-factor "$F" --aux-loss-coef "$coef" --steps 40 --sample 0 --out "$out" >/dev/null
    read -r batch seq layers <<<"$(csv_awk '{ print col("batch"), col("seq"), col("layers") }' "$out/run.csv")"
    csv_awk -v F="$F" -v coef="$coef" -v choices=$((batch * seq * 2 * layers)) \
        '{ print F "," coef "," col("step") "," col("loss") "," col("aux_loss") "," col("dropped") "," choices }' \
        "$out/steps.csv" >>"$drops"
done
cp "$sizes" "$sizes_out"
cp "$drops" "$drops_out"
echo "moe_numbers.sh: wrote $1 and $2"
