#!/usr/bin/env bats
# moe_numbers.bats: common/scripts/moe_numbers.sh, which measures the numbers of course.md's
# mixture-of-experts section with chapter 01's program: the sizes (dry runs) and the dropped
# choices per step (three short runs).

load ../helpers

SCRIPT="$REPO/common/scripts/moe_numbers.sh"

@test "moe_numbers.sh counts experts' parameters without their FLOPs, and drops that balancing reduces" {
    d="$(scratch)"
    run "$SCRIPT" "$d/sizes.csv" "$d/drops.csv"
    assert_success
    # dense, top-1 and top-2 of 8 experts: the same parameters for both MoE rows, several times
    # the dense model's; top-1's FLOPs within 1 % of the dense step's, top-2's well above
    run csv_awk '{ n++; p[n] = col("params"); f[n] = col("flops_per_step") }
        END { print (n == 3 && p[2] == p[3] && p[2] > 4 * p[1] && f[1] > 0 &&
                     f[2] > f[1] && f[2] < 1.01 * f[1] && f[3] > 1.4 * f[1]) ? "ok" : "bad" }' "$d/sizes.csv"
    assert_output "ok"
    # 40 steps of each run; dropless drops nothing, capacity 1.0 drops some at step 1, and the
    # last ten steps drop fewer with the balancing loss than without it
    run csv_awk '{ k = col("capacity_factor") "/" col("aux_loss_coef"); n[k]++; s = col("step") + 0
                   if (k == "0/0.01") zero += col("dropped")
                   if (s == 1 && k == "1.0/0.01") first = col("dropped")
                   if (s > 30) late[k] += col("dropped") }
        END { print (n["1.0/0.01"] == 40 && n["1.0/0"] == 40 && n["0/0.01"] == 40 && zero == 0 &&
                     first > 0 && late["1.0/0.01"] < late["1.0/0"]) ? "ok" : "bad" }' "$d/drops.csv"
    assert_output "ok"
    # a second run writes over its own files
    run "$SCRIPT" "$d/sizes.csv" "$d/drops.csv"
    assert_success
}

@test "moe_numbers.sh refuses to write over a file that is not its own, before running anything" {
    d="$(scratch)"
    echo "precious" >"$d/notes.txt"
    run --separate-stderr "$SCRIPT" "$d/notes.txt" "$d/drops.csv"
    assert_equal "$status" 2
    assert_equal "$stderr" "SIZES_CSV $d/notes.txt: exists and is not a moe_numbers.sh sizes CSV (valid: a new name or an earlier moe_numbers.sh sizes CSV)"
    assert_equal "$(cat "$d/notes.txt")" "precious"
    [ ! -e "$d/drops.csv" ]
    run --separate-stderr "$SCRIPT" "$d/sizes.csv"
    assert_equal "$status" 2
    assert_equal "$stderr" "usage: common/scripts/moe_numbers.sh SIZES_CSV DROPS_CSV"
}
