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
# not implemented"), the table says so, with every exercise the grader needs
# (course.md's list): the failure is that exercise's, not necessarily this
# one's. A grader that stops at its own stub alone says "not implemented".
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

# The exercises whose stubs a grader's log shows, one a line.
stubs_hit() { # log
    grep -oE 'exercise [0-9]+\.[0-9]+ not implemented' "$1" | awk '{ print $2 }' | sort -u
}
# The exercises a grader's runs reach, from course.md's dependency lines
# ("- 02.2: do 01.1, 01.2 and 01.3 first (its grader's runs reach them)."), one a line.
needs_of() { # id
    sed -n "s/^- ${1//./\\.}: do \(.*\) first (its grader.*/\1/p" course.md | grep -oE '[0-9]+\.[0-9]+'
}
commas() { paste -sd, - | sed 's/,/, /g'; }

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
        hit=$(stubs_hit "$log" | grep -vxF "$id" | commas)
        if [ -n "$hit" ]; then
            needs=$({ needs_of "$id"; stubs_hit "$log"; } | grep -vxF "$id" | sort -u | commas)
            result="FAIL (depends on $needs; stopped at $hit, not implemented yet; see $log)"
            blocked=1
        elif stubs_hit "$log" | grep -qxF "$id"; then
            result="not implemented (see $log)"
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
