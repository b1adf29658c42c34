#!/usr/bin/env bats
# The work a dry run counts (work_ledger.h, dry_work.h): each kernel's FLOPs
# from its arguments, written as dry-work.csv one row per piece of the step,
# in the order the step issues them. Dry runs only: no real run, seconds.

load ../helpers

FLAGS="--device cpu --steps 1 --sample 0 --quiet"

# Each rank's dry-work.csv of DIR as "F0 F1 B0 ... W3c1": F a forward, B a backward (zb-h1: its input
# half), W a weight half, the micro-batch, c<chunk> past chunk 0: schedule_print's names. With a
# second argument, the messages too (ra0, sa1|rg0, pg2c1, ...), the stage's whole list.
pieces_as_actions() {
    awk -F, -v all="${2:-}" 'BEGIN { split("fwd F bwd B bwd_input B bwd_weight W recv_act ra send_act sa recv_grad rg " \
                                   "send_grad sg post_act pa post_grad pg send_act_recv_grad sa send_grad_recv_act sg", w, " ")
                             for (i = 1; i < 24; i += 2) name[w[i]] = w[i + 1]
                             second["send_act_recv_grad"] = "|rg"; second["send_grad_recv_act"] = "|ra" }
        NR > 1 && ($2 in name) && (all || $2 ~ /^(fwd|bwd|bwd_input|bwd_weight)$/) {
            printf "%s%s%s%s%s", sep, name[$2], $3, ($2 in second ? second[$2] $4 : ""), ($5 > 0 ? "c" $5 : ""); sep = " " }
        END { print "" }' "$1/dry-work.csv"
}

@test "dry run of 01 counts every matmul of the step as the shapes give it" {
    # 3 layers, d 96, 3 heads (hs 32), 64 tokens, vocabulary 256, 2 micro-batches of 3 sequences
    local L=3 C=96 NH=3 T=64 V=256 B=3 M=2 out
    out="$(scratch)/dry"
    run "$TRAIN01" $FLAGS --layers $L --dmodel $C --heads $NH --seq $T --vocab $V --batch $((B * M)) --micro $M \
        --dry-run --world 1 --rank 0 --out "$out"
    assert_success
    # Each micro-batch of N = B T tokens. Forward: per layer the qkv (C -> 3C), projection (C -> C) and
    # MLP (C -> 4C -> C) products, 2 N (12 C^2), and attention's q k^T and p v, 2 x 2 T^2 hs per
    # sequence and head (T = 64: one tile of queries sees all 64 keys); the head, 2 N C V. Backward:
    # each linear's two products (input and weight), and attention's five (the scores again, dp, dq,
    # dk, dv).
    local expected
    expected="$(awk -v L=$L -v C=$C -v NH=$NH -v T=$T -v V=$V -v B=$B 'BEGIN {
        N = B * T; hs = C / NH
        linear = L * 2 * N * 12 * C * C + 2 * N * C * V
        attention = L * B * NH * 2 * 2 * T * T * hs
        printf "fwd %.0f bwd %.0f\n", linear + attention, 2 * linear + attention * 5 / 2 }')"
    local counted
    counted="$(awk -F, 'NR > 1 && $3 == 0 && ($2 == "fwd" || $2 == "bwd") { printf "%s%s %s", sep, $2, $7; sep = " " }
        END { print "" }' "$out/dry-work.csv")"
    assert_equal "$counted" "$expected"
    # both micro-batches, in the step's order, then the update of every parameter (order,action,micro,micro2,
    # chunk,flops,matmul_flops,bytes,adam_params)
    run awk -F, 'NR > 1 { printf "%s%s%s", sep, $2, $3; sep = " " } END { print "" }' "$out/dry-work.csv"
    assert_output "other0 fwd0 bwd0 fwd1 bwd1 update0"
    assert_equal "$(awk -F, '$2 == "update" { print $9 }' "$out/dry-work.csv")" \
        "$(csv_column "$out/run.csv" params)"
}

@test "dry runs of 04's stages count one piece per action, in the schedule's order" {
    local out="$(scratch)"
    # 1F1B on 2 stages, 4 micro-batches: stage 0 warms up with one forward, stage 1 with none
    local expected=("F0 F1 B0 F2 B1 F3 B2 B3" "F0 B0 F1 B1 F2 B2 F3 B3") s
    for s in 0 1; do
        run "$TRAIN04" $FLAGS --model tiny --pp 2 --schedule 1f1b --batch 4 --micro 4 --dry-run --world 2 \
            --rank $s --out "$out/1f1b-$s"
        assert_success
        assert_equal "$(pieces_as_actions "$out/1f1b-$s")" "${expected[$s]}"
    done
    # every schedule: the list of actions --print-schedule gives the stage
    local schedule flags
    for schedule in 1f1b gpipe zb-h1 "interleaved --virtual 2 --layers 4"; do
        flags="--model tiny --pp 2 --schedule $schedule --batch 4 --micro 4 --dry-run --world 2"
        for s in 0 1; do
            run "$TRAIN04" $FLAGS $flags --rank $s --out "$out/list-${schedule%% *}-$s"
            assert_success
            local listed
            listed="$("$TRAIN04" $FLAGS $flags --rank 0 --print-schedule |
                awk -v s="stage $s:" 'index($0, s) == 1 { $1 = $2 = ""; sub(/^ +/, ""); print }')"
            [ -n "$listed" ]
            # the whole list as the stage ran it, its messages too
            assert_equal "${schedule%% *} $s: $(pieces_as_actions "$out/list-${schedule%% *}-$s" all)" \
                "${schedule%% *} $s: $listed"
        done
    done
}

@test "dry run of 06 counts the host AdamW of its shard as host work" {
    local out="$(scratch)/dry"
    run "$TRAIN06" $FLAGS --model tiny --offload --dry-run --world 2 --rank 1 --out "$out"
    assert_success
    local params host
    params="$(csv_column "$out/run.csv" params)"
    host="$(awk -F, '$2 == "host_update" { print $9 }' "$out/dry-work.csv")"
    [ -n "$host" ]
    # rank 1's shard: half of the padded units, at least half the parameters, less than all
    awk -v h="$host" -v p="$params" 'BEGIN { exit !(h >= p / 2 && h < p) }'
    # nothing of it on the device: every device AdamW element is the host's
    assert_equal "$(awk -F, 'NR > 1 && $2 != "host_update" { s += $9 } END { print s + 0 }' "$out/dry-work.csv")" 0
}
