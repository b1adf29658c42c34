#!/usr/bin/env bats
# common/plan's time from the dry runs (common/tools/plan_work.h): each rank's
# dry-work.csv priced on a machine file, and a pipeline's stages replayed from
# their own lists of actions with each action's counted time
# (schedule_replay_lists). build/tests/test_plan_work prints the parts.

load ../helpers

FLAGS="--device cpu --model tiny --steps 1 --sample 0 --quiet"
TEST="$BUILD/tests/test_plan_work"

# a machine of round numbers: 1e9 FLOP/s, 1e8 AdamW elements/s on the device, 1e7 on the host
machine() {
    cat >"$1" <<'EOF'
name = round
flops = 1e9
alpha_s = 1e-6
beta_bytes_per_s = 1e9
h2d_bytes_per_s = 1e9
d2h_bytes_per_s = 1e9
cpu_adam_params_per_s = 1e7
device_adam_params_per_s = 1e8
device_mem_bytes = 1e9
overlap = 0.5
EOF
}

# part NAME: that part's value on test_plan_work's line of rank ${2:-0} in $output
part() { awk -v name="$1" -v rank="${2:-0}" '$1 == "rank" && $2 == rank { for (i = 3; i < NF; i += 2) if ($i == name) print $(i + 1) }' <<<"$output"; }

# close A B: A and B agree to 1e-9 relative
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-9 * b) }'; }

@test "a step's compute, update and host update are its dry run's counted work over the machine's rates" {
    local dir="$(scratch)"
    machine "$dir/round.machine"
    run "$TRAIN06" $FLAGS --offload --dry-run --world 2 --rank 0 --out "$dir/06"
    assert_success
    run "$TEST" "$dir/round.machine" 1 1 1 0 "$dir/06"
    assert_success
    # from the file: every piece's FLOPs but the update's and the host's are compute; the update
    # pieces' FLOPs and every device AdamW element the update; the host's elements the host update
    local expected
    expected="$(awk -F, 'NR > 1 && $2 == "host_update" { host += $9; next }
        NR > 1 && $2 == "update" { update += $6 / 1e9 } NR > 1 && $2 != "update" { compute += $6 / 1e9 }
        NR > 1 { update += $9 / 1e8 }
        END { printf "%.9g %.9g %.9g", compute, update, host / 1e7 }' "$dir/06/dry-work.csv")"
    read -r compute update host <<<"$expected"
    awk -v c="$compute" -v h="$host" 'BEGIN { exit !(c > 0 && h > 0) }'
    close "$(part compute_s)" "$compute"
    close "$(part update_s)" "$update"
    close "$(part host_update_s)" "$host"
    assert_equal "$(part bubble_s)" 0
}

@test "GPipe's two stages replayed from their dry runs take the flow shop's span" {
    local dir="$(scratch)" r
    machine "$dir/round.machine"
    for r in 0 1; do
        run "$TRAIN04" $FLAGS --pp 2 --schedule gpipe --batch 4 --micro 4 --dry-run --world 2 --rank $r \
            --out "$dir/stage$r"
        assert_success
    done
    run "$TEST" "$dir/round.machine" 2 1 4 0 "$dir/stage0" "$dir/stage1"
    assert_success
    # GPipe on 2 stages, by hand: forwards flow 0 -> 1 (stage 1's forward m waits for stage 0's and
    # its own m - 1), then backwards 1 -> 0 in the same order, stage 1 starting after its last forward
    local span
    span="$(awk -F, 'FNR == 1 { s++; next } $2 == "fwd" { f[s - 1, $3] = $6 / 1e9 } $2 == "bwd" { b[s - 1, $3] = $6 / 1e9 }
        END { M = 4
              for (m = 0; m < M; m++) { a[m] = (m ? a[m - 1] : 0) + f[0, m]
                                        c[m] = ((m && c[m - 1] > a[m]) ? c[m - 1] : a[m]) + f[1, m] }
              for (m = 0; m < M; m++) { start = m ? d[m - 1] : c[M - 1]; d[m] = start + b[1, m]
                                        prev = m ? e[m - 1] : a[M - 1]; e[m] = (prev > d[m] ? prev : d[m]) + b[0, m] }
              printf "%.9g", e[M - 1] }' "$dir/stage0/dry-work.csv" "$dir/stage1/dry-work.csv")"
    close "$(part pipeline_s 0)" "$span"
    close "$(part pipeline_s 1)" "$span"
    # each stage's bubble: the span less its own forwards and backwards
    close "$(awk -v s="$span" -v c="$(part compute_s 1)" -v o="$(awk -F, '$2 == "other" { o += $6 } END { print o / 1e9 }' "$dir/stage1/dry-work.csv")" \
        'BEGIN { printf "%.9g", s - (c - o) }')" "$(part bubble_s 1)"
}

@test "zb-h1's stages replayed from their dry runs idle less than 1f1b's, and no stage's span is under its own work" {
    local dir="$(scratch)" schedule r
    machine "$dir/round.machine"
    for schedule in 1f1b zb-h1; do
        for r in 0 1; do
            run "$TRAIN04" $FLAGS --pp 2 --schedule $schedule --batch 4 --micro 4 --dry-run --world 2 --rank $r \
                --out "$dir/$schedule-$r"
            assert_success
        done
        run "$TEST" "$dir/round.machine" 2 1 4 0 "$dir/$schedule-0" "$dir/$schedule-1"
        assert_success
        eval "span_${schedule//-/_}=$(part pipeline_s)"
        awk -v s="$(part pipeline_s)" -v c0="$(part compute_s 0)" -v c1="$(part compute_s 1)" \
            'BEGIN { exit !(s >= c0 * 0.999 && s >= c1 * 0.999) }'
    done
    awk -v z="$span_zb_h1" -v o="$span_1f1b" 'BEGIN { exit !(z < o) }'
}

@test "stages whose dry-work lists are not a schedule are refused in one line, exit 2" {
    local dir="$(scratch)" r
    machine "$dir/round.machine"
    for r in 0 1; do
        run "$TRAIN04" $FLAGS --pp 2 --schedule 1f1b --batch 4 --micro 4 --dry-run --world 2 --rank $r \
            --out "$dir/stage$r"
        assert_success
    done
    # stage 1 never receives micro-batch 2's activations: its forward would wait for ever
    awk -F, -v OFS=, 'NR == 1 || $2 != "send_grad_recv_act" || $4 != 2 { if (NR > 1) $1 = n++; print }' \
        "$dir/stage1/dry-work.csv" >"$dir/cut.csv"
    [ "$(wc -l <"$dir/cut.csv")" -lt "$(wc -l <"$dir/stage1/dry-work.csv")" ]
    mv "$dir/cut.csv" "$dir/stage1/dry-work.csv"
    run --separate-stderr "$TEST" "$dir/round.machine" 2 1 4 0 "$dir/stage0" "$dir/stage1"
    assert_failure 2
    [ "${#stderr_lines[@]}" -eq 1 ]
    [[ "$stderr" == *"dry-work.csv lists, replayed"* ]]
    # a file that is not a dry run's
    echo "order,action" >"$dir/stage1/dry-work.csv"
    run --separate-stderr "$TEST" "$dir/round.machine" 2 1 4 0 "$dir/stage0" "$dir/stage1"
    assert_failure 2
    [[ "$stderr" == *"stage1/dry-work.csv:1: header"* ]]
}

@test "--calibrate prices 01's step with the FLOPs its dry run counts, less its AdamW's time" {
    local dir="$(scratch)"
    run timeout 120 env OMP_NUM_THREADS=1 "$REPO/common/plan" --calibrate "$dir/here.machine" --quick
    assert_success
    # the same command's dry run (calibrate.sh --quick: the tiny preset's defaults)
    run "$TRAIN01" --device cpu --model tiny --steps 1 --sample 0 --quiet --dry-run --world 1 --rank 0 --out "$dir/dry"
    assert_success
    local counted adam
    counted="$(awk -F, 'NR > 1 { f += $6 } END { printf "%.6g", f }' "$dir/dry/dry-work.csv")"
    adam="$(awk -F, 'NR > 1 { a += $9 } END { print a }' "$dir/dry/dry-work.csv")"
    # the file's comment: "...: N FLOPs a step (its dry run counted them) in T ms (median), S s of it besides AdamW"
    run awk -v counted="$counted" -v adam="$adam" '
        / FLOPs a step \(its dry run counted them\)/ { for (i = 1; i <= NF; i++) { if ($(i + 1) == "FLOPs") n = $i
                                                           if ($(i + 1) == "ms") ms = $i; if ($(i + 1) == "s") s = $i } }
        $1 == "flops" { flops = $3 } $1 == "device_adam_params_per_s" { rate = $3 }
        END { besides = ms * 1e-3 - adam / rate; if (!(besides >= ms * 1e-3 / 2)) besides = ms * 1e-3
              d = flops * s / counted - 1; e = s / besides - 1
              exit !(n == counted && d < 1e-4 && d > -1e-4 && e < 1e-3 && e > -1e-3) }' "$dir/here.machine"
    assert_success
}
