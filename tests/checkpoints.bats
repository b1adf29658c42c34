#!/usr/bin/env bats
# Checkpoints that should not be accepted are refused before training, with
# one line naming what is wrong: a checksum over the header and the arrays
# catches any flipped bit, every header field is range-checked, and a resume
# with nothing left to do says so instead of training into NaN or writing a
# mislabelled checkpoint.

load helpers

# A checkpoint at step 3 of 6, made once for the file.
setup_file() {
    export CK_DIR="$BATS_FILE_TMPDIR"
    "$TRAIN01" --device cpu --steps 6 --stop-after 3 --save "$CK_DIR/ck" --sample 0 --quiet \
        --out "$CK_DIR/first" >/dev/null
}

resume() {
    run --separate-stderr timeout 10 "$TRAIN01" --device cpu --sample 0 --quiet --out "$(scratch)/out" "$@"
}

# Exit 2, one stderr line containing $1, and no training output written.
assert_refused_checkpoint() {
    echo "status $status; stderr: $stderr"
    assert_equal "$status" 2
    assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" 1
    [[ "$stderr" == *"$1"* ]]
    [ ! -e "$(scratch)/out/steps.csv" ]
}

# patch FILE OFFSET FORMAT VALUE: overwrite bytes with struct.pack(FORMAT, VALUE)
patch() {
    python3 -c 'import struct, sys
path, offset, fmt, value = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
data = bytearray(open(path, "rb").read())
packed = struct.pack("<" + fmt, float(value) if fmt == "f" else int(value))
data[offset:offset + len(packed)] = packed
open(path, "wb").write(data)' "$@"
}

@test "a flipped exponent bit in a parameter is refused by the checksum" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    # parameter 100 starts at byte 120 + 4*100; bit 6 of its last byte is an exponent bit
    python3 -c 'import sys
path = sys.argv[1]; data = bytearray(open(path, "rb").read())
data[120 + 4 * 100 + 3] ^= 0x40
open(path, "wb").write(data)' "$(scratch)/ck"
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: checksum"
}

@test "a flipped bit in Adam's second moment is refused too" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    size=$(stat -c %s "$(scratch)/ck")
    python3 -c 'import sys
path = sys.argv[1]; data = bytearray(open(path, "rb").read())
data[-5] ^= 0x01
open(path, "wb").write(data)' "$(scratch)/ck"
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: checksum"
}

@test "a header with adam_t -5 is refused, naming the field" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    patch "$(scratch)/ck" 88 i -5
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: adam_t -5 (valid: 3..3)"
}

@test "a header with step -1 is refused as corrupt, not as a --steps problem" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    patch "$(scratch)/ck" 84 i -1
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: step -1 (valid: 0..6)"
}

@test "a header with a learning rate of NaN is refused" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    patch "$(scratch)/ck" 56 f nan
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: lr nan"
}

@test "resuming a step-3 checkpoint with --steps 3 says there is nothing to do" {
    resume --steps 3 --resume "$CK_DIR/ck"
    assert_refused_checkpoint "the checkpoint is at step 3 and --steps is 3: nothing to do"
}

@test "--stop-after before the checkpoint's step is refused, not saved mislabelled" {
    resume --steps 6 --stop-after 2 --resume "$CK_DIR/ck" --save "$(scratch)/ck2"
    assert_refused_checkpoint "--stop-after 2 is not after the checkpoint's step 3 (valid: --stop-after 4..6)"
    [ ! -e "$(scratch)/ck2" ]
}

@test "a checkpoint of the old format (version 1) is refused naming the versions" {
    cp "$CK_DIR/ck" "$(scratch)/ck"
    patch "$(scratch)/ck" 8 I 1
    resume --steps 6 --resume "$(scratch)/ck"
    assert_refused_checkpoint "checkpoint format version 1, this program reads version 2"
}

@test "a checkpoint that is sound resumes and finishes the run" {
    resume --steps 6 --resume "$CK_DIR/ck"
    assert_success
    assert_equal "$(csv_column "$(scratch)/out/steps.csv" step | tr '\n' ' ')" "4 5 6 "
}
