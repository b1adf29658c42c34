#!/usr/bin/env bats
# 01_single_gpu/train: learning, determinism, checkpoints, memory accounting.

load ../helpers

# Small, fast runs: tiny preset, CPU, no sample text.
train01() { "$TRAIN01" --device cpu --sample 0 --quiet "$@"; }

@test "--help lists every shared flag with its default" {
    run "$TRAIN01" --help
    assert_success
    for flag in --device --model --layers --dmodel --heads --seq --vocab --batch --micro --steps --lr \
                --warmup --wd --clip --seed --data --out --device-mem-limit --eval-every --sample --save \
                --resume --help; do
        assert_output --partial -- "$flag"
    done
    assert_output --partial "(default 8)"      # --batch
    assert_output --partial "(default tiny)"   # --model
    # a range in the help is the one the flag's check enforces ({range}: the row's own bounds)
    local help="$output"
    for flag in --vocab --layers --batch --steps --eval-batches; do
        run --separate-stderr "$TRAIN01" "$flag" 99999999999
        range="$(sed -n 's/.*(valid: \([0-9.]*\)).*/\1/p' <<<"$stderr")"
        [ -n "$range" ] && grep -qF -- "$range" <<<"$(grep -F -- "  $flag " <<<"$help")" ||
            { echo "$flag: help does not show its checked range '$range'"; return 1; }
    done
}

@test "the tiny preset's loss falls well below ln(256) within 300 steps on the shipped corpus" {
    out="$(scratch)/learn"
    run train01 --model tiny --steps 300 --out "$out"
    assert_success
    first=$(csv_column "$out/steps.csv" loss | head -1)
    last=$(csv_column "$out/steps.csv" loss | tail -1)
    val=$(csv_column "$out/steps.csv" val_loss | tail -1)
    # ln(256) = 5.545: an untrained byte model; well below means under 3.2 (bigram-level text)
    awk -v f="$first" -v l="$last" -v v="$val" 'BEGIN { exit !(f > 5.0 && l < 3.2 && v < 3.5) }'
}

@test "the first loss of an untrained model is close to ln(vocab)" {
    out="$(scratch)/init"
    run train01 --steps 1 --out "$out"
    assert_success
    first=$(csv_column "$out/steps.csv" loss | head -1)
    awk -v f="$first" 'BEGIN { exit !(f > 5.4 && f < 5.7) }'
}

@test "the same flags twice give identical losses" {
    train01 --steps 12 --out "$(scratch)/a"
    train01 --steps 12 --out "$(scratch)/b"
    run diff <(csv_column "$(scratch)/a/steps.csv" loss) <(csv_column "$(scratch)/b/steps.csv" loss)
    assert_success
}

@test "a different seed gives different losses" {
    train01 --steps 3 --out "$(scratch)/a"
    train01 --steps 3 --seed 7 --out "$(scratch)/b"
    run diff <(csv_column "$(scratch)/a/steps.csv" loss) <(csv_column "$(scratch)/b/steps.csv" loss)
    assert_failure
}

@test "resuming from a checkpoint taken at step 10 gives the uninterrupted run's losses" {
    d=$(scratch)
    train01 --steps 20 --out "$d/full"
    train01 --steps 20 --stop-after 10 --save "$d/ck.bin" --out "$d/first"
    [ -f "$d/ck.bin" ] && [ ! -e "$d/ck.bin.tmp" ]
    run train01 --steps 20 --resume "$d/ck.bin" --out "$d/second"
    assert_success
    assert_equal "$(csv_column "$d/second/steps.csv" step | head -1)" "11"
    run diff <(csv_column "$d/full/steps.csv" loss) \
             <(csv_column "$d/first/steps.csv" loss; csv_column "$d/second/steps.csv" loss)
    assert_success
}

@test "gradient accumulation over 4 micro-batches matches one full batch within 1e-4" {
    d=$(scratch)
    train01 --steps 8 --batch 8 --micro 1 --out "$d/one"
    train01 --steps 8 --batch 8 --micro 4 --out "$d/four"
    assert_losses_match "$d/one" "$d/four" 8
}

@test "memory.csv holds 4, 4 and 8 bytes per parameter for params, grads and optimizer" {
    out="$(scratch)/mem"
    train01 --model small --steps 1 --out "$out"
    # the parameter count from the architecture, independently of the program:
    # wte + wpe + L * (12 C^2 + 13 C) + lnf (2C) + lm_head
    L=4 C=128 T=128 V=256
    P=$(( V*C + T*C + L*(12*C*C + 13*C) + 2*C + V*C ))
    assert_equal "$(csv_column "$out/run.csv" params)" "$P"
    row() { awk -F, -v c="$1" '$1 == 0 && $2 == "device" && $3 == c { print $4 }' "$out/memory.csv"; }
    assert_equal "$(row params)" "$((4 * P))"
    assert_equal "$(row grads)" "$((4 * P))"
    assert_equal "$(row optimizer)" "$((8 * P))"
    [ "$(row activations)" -gt 0 ]
    # one row per rank, space and category
    assert_equal "$(wc -l < "$out/memory.csv")" "17"
}

@test "--recompute gives bit-identical losses, with one and with two micro-batches" {
    d=$(scratch)
    for micro in 1 2; do
        train01 --steps 6 --micro $micro --out "$d/keep$micro"
        train01 --steps 6 --micro $micro --recompute --out "$d/recompute$micro"
        run diff <(csv_column "$d/keep$micro/steps.csv" loss) <(csv_column "$d/recompute$micro/steps.csv" loss)
        assert_success
    done
    train01 --steps 6 --recompute=0 --out "$d/zero"   # =0 is the default: everything kept
    run diff <(csv_column "$d/keep1/steps.csv" loss) <(csv_column "$d/zero/steps.csv" loss)
    assert_success
}

@test "--recompute keeps the block inputs and one block's values: activation bytes match the formula" {
    d=$(scratch)
    train01 --model small --steps 1 --out "$d/keep"
    train01 --model small --steps 1 --recompute --out "$d/recompute"
    row() { awk -F, '$1 == 0 && $2 == "device" && $3 == "activations" { print $4 }' "$1/memory.csv"; }
    # small: L=4, C=128, NH=4, T=128, V=256, batch 8; per micro-batch, in floats:
    L=4 C=128 NH=4 T=128 V=256 B=8
    BT=$((B * T))
    inputs=$(( BT*C + L*BT*C ))                       # encoded, then each block's output res3
    one_block=$(( BT*(11*C + 4) + B*NH*T ))           # ln1 atty res2 ln2 (C), qkv (3C), fch (4C), 4 stats, lse
    rest=$(( 2*BT + BT*C + 2*BT + 2*BT*V + BT ))      # tokens, targets; lnf, mean, rstd; logits, probs, losses
    assert_equal "$(row "$d/recompute")" "$(( 4 * (inputs + one_block + rest) ))"
    [ "$(row "$d/recompute")" -lt "$(row "$d/keep")" ]
    # what is saved is L-1 blocks' values (all of a block but its output)
    assert_equal "$(( $(row "$d/keep") - $(row "$d/recompute") ))" "$(( 4 * (L - 1) * one_block ))"
}

@test "--recompute takes no value, 0 or 1; anything else is refused" {
    run "$TRAIN01" --recompute=2 --steps 1
    assert_failure 2
    assert_output --partial "--recompute: 2 is out of range (valid: 0..1)"
    run "$TRAIN01" --help
    assert_output --partial "--recompute[=0|1]"
}

@test "steps.csv and run.csv carry the shared columns" {
    out="$(scratch)/cols"
    train01 --steps 2 --out "$out"
    assert_equal "$(head -1 "$out/steps.csv")" \
        "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss"
    assert_equal "$(head -1 "$out/run.csv")" \
        "program,device,world_size,dp,tp,pp,zero,params,layers,dmodel,heads,seq,batch,micro,steps,final_loss,median_step_ms,tokens_per_s,peak_device_bytes"
    assert_equal "$(wc -l < "$out/steps.csv")" "3"
}

@test "--eval-every reports validation loss on the steps it names" {
    out="$(scratch)/eval"
    train01 --steps 6 --eval-every 2 --out "$out"
    run csv_column "$out/steps.csv" val_loss
    assert_equal "$(echo "$output" | grep -c .)" "3"   # steps 2, 4 and 6
    assert_equal "$(echo "$output" | sed -n 1p)" ""     # step 1: none
}

@test "the learning rate warms up linearly, then decays by cosine to a tenth" {
    out="$(scratch)/lr"
    train01 --steps 20 --warmup 4 --lr 0.002 --out "$out"
    run csv_column "$out/steps.csv" lr
    awk -v l="$(echo "$output" | sed -n 1p)" 'BEGIN { exit !(l > 0.000499 && l < 0.000501) }'
    awk -v l="$(echo "$output" | sed -n 4p)" 'BEGIN { exit !(l > 0.001999 && l < 0.002001) }'
    awk -v l="$(echo "$output" | sed -n 20p)" 'BEGIN { exit !(l > 0.000199 && l < 0.000201) }'
}

@test "--sample prints generated text after the prompt" {
    run "$TRAIN01" --device cpu --steps 2 --sample 40 --out "$(scratch)/s"
    assert_success
    assert_line --regexp '^sample: .+\|.+'
}

@test "--device auto runs on the CPU when no GPU is visible" {
    "$BUILD/tests/gpu_probe" >/dev/null && skip "a GPU is visible"
    run "$TRAIN01" --device auto --steps 1 --sample 0 --out "$(scratch)/auto"
    assert_success
    assert_output --partial "device cpu"
}
