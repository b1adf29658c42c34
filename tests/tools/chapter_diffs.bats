#!/usr/bin/env bats
# chapter_diffs.bats: the neighbour diffs of the chapters and their budget
# (common/python/chapter_diffs.py), on a made-up repository whose differences
# are known line by line.

load ../helpers

setup() {
    FAKE="$BATS_TEST_TMPDIR/fake"
    mkdir -p "$FAKE/01_a" "$FAKE/02_b" "$FAKE/03_c"
    seq 1 100 | sed 's/^/line /' >"$FAKE/01_a/train.c"
    # 02 = 01 with lines 10-12 replaced by four others and 5 lines added at the end, plus a module of its own
    { sed -n 1,9p "$FAKE/01_a/train.c"; printf 'new %s\n' a b c d; sed -n 13,100p "$FAKE/01_a/train.c"
      printf 'tail %s\n' 1 2 3 4 5; } >"$FAKE/02_b/train.c"
    printf 'int x;\nint y;\n' >"$FAKE/02_b/sync.c"
    printf 'int x;\n' >"$FAKE/02_b/sync.h"
    printf 'int bench;\n' >"$FAKE/02_b/commbench.c"
    cp "$FAKE/02_b/train.c" "$FAKE/03_c/train.c"
    cp "$FAKE/02_b/sync.c" "$FAKE/03_c/sync.c"
    echo 'int z;' >>"$FAKE/03_c/sync.c"
}

@test "the table counts the lines each train.c diff removes and adds, and the chapter's own files" {
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$BATS_TEST_TMPDIR/d"
    assert_success
    assert_line "| 01 -> 02 | 3 / 9 | 0 / 3 | \`sync.c\`, \`sync.h\` |"
    assert_line "| 02 -> 03 | 0 / 0 | 0 / 1 | \`sync.c\` |"
    # the written diff applies: 01's train.c patched by it is 02's
    cp "$FAKE/01_a/train.c" "$BATS_TEST_TMPDIR/t.c"
    csplit -s -f "$BATS_TEST_TMPDIR/part" "$BATS_TEST_TMPDIR/d/01-02.diff" '/^--- /' '{*}'
    patch -s "$BATS_TEST_TMPDIR/t.c" "$BATS_TEST_TMPDIR/part01"
    cmp "$BATS_TEST_TMPDIR/t.c" "$FAKE/02_b/train.c"
}

@test "a train.c diff over the budget fails the check, naming the pair and the count" {
    seq 1 40 | sed 's/^/gone /' >>"$FAKE/02_b/train.c" # 02 -> 03 now removes 40 lines
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check
    assert_failure
    [[ "$stderr" == *"02_b -> 03_c: train.c removes 40 lines (budget 30)"* ]]
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check --out "$BATS_TEST_TMPDIR/d2"
    assert_failure
}

@test "within the budget the check passes" {
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check
    assert_success
}

@test "--pairs limits the table and the check to the pairs named, and refuses one that is no pair" {
    seq 1 40 | sed 's/^/gone /' >>"$FAKE/02_b/train.c" # 02 -> 03 removes 40 lines; 01 -> 02 stays within
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check --pairs 01-02
    assert_success
    refute_line --partial "| 02 -> 03 |"
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check --pairs 01-02,02-03
    assert_failure
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --pairs 01-03
    assert_failure
    [[ "$stderr" == *"--pairs names 01-03, not a neighbour pair (valid: 01-02, 02-03)"* ]]
}

@test "--write-course puts each pair's row and train.c diff between course.md's marks, and --check-course finds a stale one" {
    printf '# Chapter 02\n\n<!-- chapter diff 02 -->\nold\n<!-- end chapter diff 02 -->\n\ntext\n' >"$FAKE/course.md"
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check-course
    assert_failure
    [[ "$stderr" == *"course.md's diff rows (chapters 02) are not the current ones"* ]]
    python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --write-course
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check-course # current now
    assert_success
    grep -qx '| 01 -> 02 | 3 / 9 | 0 / 3 | `sync.c`, `sync.h` |' "$FAKE/course.md"
    ! grep -qx old "$FAKE/course.md"
    # the diff folded under the row is train.c's whole diff: 01's train.c patched by it is 02's
    sed -n '/^```diff$/,/^```$/p' "$FAKE/course.md" | sed '1d;$d' >"$BATS_TEST_TMPDIR/course.diff"
    grep -q '^+tail 5$' "$BATS_TEST_TMPDIR/course.diff"
    cp "$FAKE/01_a/train.c" "$BATS_TEST_TMPDIR/t.c"
    patch -s "$BATS_TEST_TMPDIR/t.c" "$BATS_TEST_TMPDIR/course.diff"
    cmp "$BATS_TEST_TMPDIR/t.c" "$FAKE/02_b/train.c"
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check-course
    assert_success
    # a chapter's train.c edited after the course was written, the counts unchanged: the folded diff is stale
    sed -i 's/^new a$/new z/' "$FAKE/02_b/train.c"
    python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --pairs 01-02 | grep -qF '| 01 -> 02 | 3 / 9 |'
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check-course
    assert_failure
    # with two marked chapters, the message names the stale one only
    printf '\n<!-- chapter diff 03 -->\n<!-- end chapter diff 03 -->\n' >>"$FAKE/course.md"
    python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --write-course
    echo 'tail 6' >>"$FAKE/03_c/train.c"
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --check-course
    assert_failure
    [[ "$stderr" == *"course.md's diff rows (chapters 03) are not the current ones"* ]]
}

@test "chapter_diffs.py refuses a --repo that is not a directory in one line, exit 2" {
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo /nonexistent
    assert_equal "$status" 2
    assert_equal "${#stderr_lines[@]}" 1
    assert_equal "$stderr" "chapter_diffs: --repo /nonexistent: is not a directory (valid: a copy of the course, whose chapter folders NN_name hold train.c)"
}

@test "chapter_diffs.py refuses an --out it cannot create in one line, exit 2" {
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out /proc/x
    assert_equal "$status" 2
    assert_equal "${#stderr_lines[@]}" 1
    assert_regex "$stderr" "^chapter_diffs: --out /proc/x: cannot write there \(.*\) \(valid: a directory this user can write\)$"
}

@test "chapter_diffs.py --out refuses a text file at a diff's name and a directory, and takes a new name and its own diffs" {
    local out="$BATS_TEST_TMPDIR/d" text="$REPO/tests/fixtures/text.txt"
    # a new name, then again over its own earlier diffs
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$out"
    assert_success
    cp "$out/01-02.diff" "$BATS_TEST_TMPDIR/first.diff"
    printf 'int w;\n' >>"$FAKE/02_b/sync.h"
    run python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$out"
    assert_success
    grep -q '^+int w;$' "$out/01-02.diff"
    # a file that is not its diff, and a directory, are refused before any diff is written
    cp "$text" "$out/02-03.diff"
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "chapter_diffs: --out $out/02-03.diff: exists and is not a diff chapter_diffs.py wrote (valid: a new name or an earlier diff chapter_diffs.py wrote)"
    cmp "$out/02-03.diff" "$text"
    rm "$out/02-03.diff"
    mkdir "$out/02-03.diff"
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "chapter_diffs: --out $out/02-03.diff: is a directory (valid: a file name)"
    # --out itself a text file
    cp "$text" "$BATS_TEST_TMPDIR/notes.txt"
    run --separate-stderr python3 "$REPO/common/python/chapter_diffs.py" --repo "$FAKE" --out "$BATS_TEST_TMPDIR/notes.txt"
    assert_equal "$status" 2
    assert_equal "$stderr" "chapter_diffs: --out $BATS_TEST_TMPDIR/notes.txt: exists and is not a directory (valid: a new name or a directory)"
    cmp "$BATS_TEST_TMPDIR/notes.txt" "$text"
}

# The real chapters: the pairs made cumulative (issue 27: every pair, 01 -> 02 to 05 -> 06) keep within
# their budget (or the exception the table states), and course.md shows the current rows.
@test "the cumulative chapters' train.c diffs keep within budget, and course.md shows the current table rows" {
    run python3 "$REPO/common/python/chapter_diffs.py" --check --pairs 01-02,02-03,03-04,04-05,05-06
    assert_success
    run python3 "$REPO/common/python/chapter_diffs.py" --check-course
    assert_success
}

@test "no chapter needs an exception to the train.c diff budget: every neighbour pair within 30 removed / 150 added" {
    run python3 -c "import sys; sys.path.insert(0, '$REPO/common/python'); import chapter_diffs; print(len(chapter_diffs.EXCEPTIONS), chapter_diffs.BUDGET['removed'], chapter_diffs.BUDGET['added'])"
    assert_success
    assert_output "0 30 150"
    run python3 "$REPO/common/python/chapter_diffs.py" --check
    assert_success
}
