#!/usr/bin/env bash
# grade.sh [ID...] | grade.sh --only ID,ID,...: run each exercise's grader
# (tests/grade/ID.bats), or only those of the exercises named, and print a
# score table. Exit status 0 only at full marks, 2 for a name that is no
# exercise (or an empty one: `ONLY=,,` names none). Called by `make grade
# [ONLY=01.2,05.4]` (as --only) after building; a grader's full output goes
# to runs/grade/ID.log.
#
# Some graders run whole programs, which reach other exercises' code (the
# trainers of 02-06 need chapter 01's, for instance); which ones each grader
# reaches is measured by common/python/exercise_deps.py and listed in course.md. When
# a grader fails and its log shows another exercise's stub ("exercise 01.2
# not implemented"), the table says so: the failure is that exercise's, not
# necessarily this one's.
set -uo pipefail
cd "$(dirname "$0")/../.."

# the exercises there are, as a refusal lists them: 01.1, 01.2, ...
exercise_ids() {
    local grader ids=()
    for grader in tests/grade/*.bats; do ids+=("$(basename "$grader" .bats)"); done
    local IFS=,
    echo "${ids[*]}" | sed 's/,/, /g'
}

if [ "${1-}" = --only ]; then # make grade ONLY=LIST: the names between its commas, none of them empty
    [ $# -eq 2 ] || { echo "grade.sh: --only takes one list, ID,ID,... (valid: $(exercise_ids))" >&2; exit 2; }
    only="$2"
    IFS=, read -ra names <<<"$only,"
    set --
    for id in "${names[@]}"; do
        id="${id#"${id%%[![:space:]]*}"}" id="${id%"${id##*[![:space:]]}"}" # without the spaces around it
        [ -n "$id" ] || {
            echo "grade.sh: ONLY='$only' has an empty exercise name (valid: comma-separated ids of $(exercise_ids))" >&2
            exit 2
        }
        set -- "$@" "$id"
    done
fi
graders=()
for id in "$@"; do
    [ -f "tests/grade/$id.bats" ] || { echo "grade.sh: no exercise '$id' (valid: $(exercise_ids))" >&2; exit 2; }
    graders+=("tests/grade/$id.bats")
done
[ $# -gt 0 ] || graders=(tests/grade/*.bats)

mkdir -p runs/grade
total=0 earned=0 blocked=0

# The other exercises whose stubs a grader's log shows, comma-separated.
stubs_hit_besides() { # log id
    grep -oE 'exercise [0-9]+\.[0-9]+ not implemented' "$1" | awk -v own="$2" '$2 != own { print $2 }' |
        sort -u | paste -sd, - | sed 's/,/, /g'
}

printf '%-9s %-40s %6s  %s\n' exercise title points result
printf '%-9s %-40s %6s  %s\n' -------- ---------------------------------------- ------ ------
for grader in "${graders[@]}"; do
    id=$(basename "$grader" .bats)
    title=$(sed -n 's/^# title: *//p' "$grader")
    points=$(sed -n 's/^# points: *//p' "$grader")
    log="runs/grade/$id.log"
    if bats "$grader" >"$log" 2>&1; then
        result=pass
        earned=$((earned + points))
    else
        needs=$(stubs_hit_besides "$log" "$id")
        if [ -n "$needs" ]; then
            result="FAIL (depends on $needs, not implemented yet; see $log)"
            blocked=1
        else
            result="FAIL (see $log)"
        fi
    fi
    total=$((total + points))
    printf '%-9s %-40s %6s  %s\n' "$id" "$title" "$points" "$result"
done
printf '%-9s %-40s %6s\n' total "" "$earned/$total"
[ "$blocked" -eq 0 ] ||
    echo "A grader marked \"depends on\" stopped at another exercise's stub: do that exercise first."
[ "$earned" -eq "$total" ]
