#!/usr/bin/env bash
# grade.sh: run each exercise's grader (tests/grade/ID.bats) and print a
# score table. Exit status 0 only at full marks. Called by `make grade`
# after building; a grader's full output goes to runs/grade/ID.log.
set -uo pipefail
cd "$(dirname "$0")/.."

mkdir -p runs/grade
total=0 earned=0
printf '%-9s %-40s %6s  %s\n' exercise title points result
printf '%-9s %-40s %6s  %s\n' -------- ---------------------------------------- ------ ------
for grader in tests/grade/*.bats; do
    id=$(basename "$grader" .bats)
    title=$(sed -n 's/^# title: *//p' "$grader")
    points=$(sed -n 's/^# points: *//p' "$grader")
    log="runs/grade/$id.log"
    if bats "$grader" >"$log" 2>&1; then
        result=pass
        earned=$((earned + points))
    else
        result="FAIL (see $log)"
    fi
    total=$((total + points))
    printf '%-9s %-40s %6s  %s\n' "$id" "$title" "$points" "$result"
done
printf '%-9s %-40s %6s\n' total "" "$earned/$total"
[ "$earned" -eq "$total" ]
