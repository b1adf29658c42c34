#!/usr/bin/env bats
# Checkpoints (common/run/checkpoint.h): one layout-independent format for every
# chapter. A checkpoint saved at step 3 by any chapter and layout resumes in
# any other, and the resumed steps 4-6 give the uninterrupted single-device
# run's losses (fp32: within 1e-5; bit for bit where the layout is the same).
# The content is the logical model, so layouts that compute the same numbers
# write the same checkpoint (the same checksum). common/ckpt inspects and
# exports it. Bad checkpoints are refused before training, with one line.

load ../helpers

CKPT="$REPO/common/ckpt"
# Tiny model, 6 steps, a global batch of 12 (divisible by 2, 3 and 4 ranks); a
# private copy of the corpus, so that editing course.md meanwhile changes nothing.
FLAGS="--device cpu --steps 6 --batch 12 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"
export OMP_NUM_THREADS=1

# The reference run, and step-3 checkpoints of six layouts (01; 02 on 2 ranks;
# 03's layer split and 04's pipeline over 2 stages; 05 stage 3 on 2 ranks;
# 06 offloading 2 stages x 2 replicas), made once for the file.
setup_file() {
    local d="$BATS_FILE_TMPDIR"
    cp "$REPO/course.md" "$d/corpus.txt"
    "$TRAIN01" $FLAGS --out "$d/full" >/dev/null
    "$TRAIN01" $FLAGS --stop-after 3 --save "$d/ck01" --out "$d/first01" >/dev/null
    mpirun_np 2 "$TRAIN02" $FLAGS --stop-after 3 --save "$d/ck02" --out "$d/first02" >/dev/null
    mpirun_np 2 "$TRAIN03" $FLAGS --mp layer --stop-after 3 --save "$d/ck03" --out "$d/first03" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --stop-after 3 --save "$d/ck04" --out "$d/first04" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --stop-after 3 --save "$d/ck05" --out "$d/first05" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --dp 2 --offload --stop-after 3 --save "$d/ck06" --out "$d/first06" >/dev/null
}

CK="$BATS_FILE_TMPDIR"

# assert_resumed RUN_DIR [STEPS]: the run logged STEPS (default "4 5 6"), each
# loss within 1e-5 (relative) of the uninterrupted reference run's.
assert_resumed() {
    local run="$1" steps="${2:-4 5 6}"
    assert_equal "$(csv_column "$run/steps.csv" step | tr '\n' ' ')" "$steps "
    join -t, <(paste -d, <(csv_column "$CK/full/steps.csv" step) <(csv_column "$CK/full/steps.csv" loss)) \
        <(paste -d, <(csv_column "$run/steps.csv" step) <(csv_column "$run/steps.csv" loss)) |
        awk -F, -v want="$(wc -w <<<"$steps")" '{ n++; r = ($2 - $3) / $2; if (r < 0) r = -r
                                                  if (r > 1e-5) { print "step " $1 ": " $2 " against " $3; bad = 1 } }
                 END { if (n != want) print n " steps against the uninterrupted run, " want " expected"; exit bad || n != want }'
}

# The checksum common/ckpt verifies.
checksum_of() { "$CKPT" verify "$1" | awk '{ print $2 }'; }

# ---- resuming in another layout ----

@test "01 -> 03 tensor parallel on 2 ranks -> 01: the resumed steps equal the uninterrupted run's within 1e-5" {
    mpirun_np 2 "$TRAIN03" $FLAGS --mp tensor --resume "$CK/ck01" --stop-after 5 --save "$(scratch)/ck" --out "$(scratch)/tp"
    assert_resumed "$(scratch)/tp" "4 5"
    "$TRAIN01" $FLAGS --resume "$(scratch)/ck" --out "$(scratch)/one" >/dev/null
    assert_resumed "$(scratch)/one" "6"
}

@test "03 layer split -> 04 pipeline (1F1B over 2 stages) resumes within 1e-5" {
    mpirun_np 2 "$TRAIN04" $FLAGS --resume "$CK/ck03" --out "$(scratch)/run"
    assert_resumed "$(scratch)/run"
}

@test "04 (2 stages) -> 02 on 3 ranks resumes within 1e-5" {
    mpirun_np 3 "$TRAIN02" $FLAGS --resume "$CK/ck04" --out "$(scratch)/run"
    assert_resumed "$(scratch)/run"
}

@test "02 on 2 ranks -> 01 resumes within 1e-5" {
    "$TRAIN01" $FLAGS --resume "$CK/ck02" --out "$(scratch)/run" >/dev/null
    assert_resumed "$(scratch)/run"
}

@test "05 stage 3 on 2 ranks -> 01, and -> 05 stage 1 on 3 ranks (dp 2 -> 3, other shards), resume within 1e-5" {
    "$TRAIN01" $FLAGS --resume "$CK/ck05" --out "$(scratch)/one" >/dev/null
    assert_resumed "$(scratch)/one"
    mpirun_np 3 "$TRAIN05" $FLAGS --zero 1 --resume "$CK/ck05" --out "$(scratch)/three"
    assert_resumed "$(scratch)/three"
}

@test "06 combined (2 stages x 2 replicas, offload) -> 05 stage 2 on 3 ranks within 1e-5, -> 06 bit for bit; 01 -> 06" {
    mpirun_np 3 "$TRAIN05" $FLAGS --zero 2 --resume "$CK/ck06" --out "$(scratch)/five"
    assert_resumed "$(scratch)/five"
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --dp 2 --offload --out "$(scratch)/whole" >/dev/null
    mpirun_np 4 "$TRAIN06" $FLAGS --pp 2 --dp 2 --offload --resume "$CK/ck06" --out "$(scratch)/six"
    run diff <(csv_column "$(scratch)/whole/steps.csv" loss | tail -3) <(csv_column "$(scratch)/six/steps.csv" loss)
    assert_success
    "$TRAIN06" $FLAGS --offload --resume "$CK/ck01" --out "$(scratch)/one" >/dev/null
    assert_resumed "$(scratch)/one"
}

@test "06 --dpu: a checkpoint holds the update in flight, and the resumed run continues the saving run bit for bit" {
    "$TRAIN06" $FLAGS --offload --dpu --save "$(scratch)/every" --save-every 3 --out "$(scratch)/whole" >/dev/null
    "$TRAIN06" $FLAGS --offload --dpu --stop-after 3 --save "$(scratch)/ck" --out "$(scratch)/first" >/dev/null
    "$TRAIN06" $FLAGS --offload --dpu --resume "$(scratch)/ck" --out "$(scratch)/run" >/dev/null
    run diff <(csv_column "$(scratch)/whole/steps.csv" loss | tail -3) <(csv_column "$(scratch)/run/steps.csv" loss)
    assert_success
    # the save made a difference: without it step 4 computes with weights one update stale
    "$TRAIN06" $FLAGS --offload --dpu --out "$(scratch)/nosave" >/dev/null
    [ "$(csv_column "$(scratch)/nosave/steps.csv" loss | sed -n 4p)" != "$(csv_column "$(scratch)/run/steps.csv" loss | sed -n 1p)" ]
}

@test "every chapter, 05 and 06 included, says which checkpoint it resumed from and at which step" {
    local line="resumed from $CK/ck01 at step 3"
    run "$TRAIN01" $FLAGS --resume "$CK/ck01" --out "$(scratch)/01"
    assert_line "$line"
    run mpirun_np 2 "$TRAIN02" $FLAGS --resume "$CK/ck01" --out "$(scratch)/02"
    assert_line "$line"
    run mpirun_np 2 "$TRAIN03" $FLAGS --mp layer --resume "$CK/ck01" --out "$(scratch)/03"
    assert_line "$line"
    run mpirun_np 2 "$TRAIN04" $FLAGS --pp 2 --resume "$CK/ck01" --out "$(scratch)/04"
    assert_line "$line"
    run mpirun_np 2 "$TRAIN05" $FLAGS --zero 1 --resume "$CK/ck01" --out "$(scratch)/05"
    assert_success
    assert_line --index 1 "$line" # after the header, as in 01-04
    run "$TRAIN06" $FLAGS --offload --resume "$CK/ck01" --out "$(scratch)/06"
    assert_success
    assert_line --index 0 --partial "06_offload/train | 1 ranks |" # the header, then the layout's lines
    assert_line "$line"
}

@test "the same layout resumes bit for bit: 05 stage 3 on 2 ranks, interrupted at step 3 or not" {
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --out "$(scratch)/whole"
    mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --resume "$CK/ck05" --out "$(scratch)/run"
    run diff <(csv_column "$(scratch)/whole/steps.csv" loss | tail -3) <(csv_column "$(scratch)/run/steps.csv" loss)
    assert_success
}

@test "a checkpoint is the logical model: 01, the layer split and the pipeline write the same one, and so do 02 and 05 stage 3 on two replicas" {
    run "$CKPT" verify "$CK"/ck0[1-5]
    assert_success
    local sums=($(awk '{ print $2 }' <<<"$output")) # ck01 .. ck05
    assert_equal "${sums[2]}" "${sums[0]}"
    assert_equal "${sums[3]}" "${sums[0]}"
    assert_equal "${sums[4]}" "${sums[1]}"
    [ "${sums[1]}" != "${sums[0]}" ] # (two replicas sum the gradients in another order)
}

@test "host-memory shards of two stages x three replicas (chapter 06's layout) write one file a whole-model layout reads back" {
    run "$BUILD/tests/test_checkpoint" "$(scratch)"
    assert_success
    assert_output --partial "the whole model read back every element of the six shards"
    assert_output --partial "one writer of the whole model gives the same checksum"
    # a layout that leaves elements out is refused at the commit; the checkpoint already there stays
    run --separate-stderr "$BUILD/tests/test_checkpoint" "$(scratch)" gap
    assert_equal "$status" 1
    [[ "$stderr" == *"the ranks wrote 114796 elements of params, the model has 136960"* ]]
    "$CKPT" verify "$(scratch)/ck"
    [ ! -e "$(scratch)/ck.tmp" ]
}

# ---- precision ----

@test "fp16 with a dynamic loss scale resumes bit for bit, the scale and its clean steps included" {
    local f="--precision fp16 --loss-scale-window 2"
    "$TRAIN01" $FLAGS $f --out "$(scratch)/whole" >/dev/null
    "$TRAIN01" $FLAGS $f --stop-after 3 --save "$(scratch)/ck" --out "$(scratch)/first" >/dev/null
    "$TRAIN01" $FLAGS $f --resume "$(scratch)/ck" --out "$(scratch)/run" >/dev/null
    for column in loss loss_scale skipped; do
        run diff <(csv_column "$(scratch)/whole/steps.csv" $column | tail -3) <(csv_column "$(scratch)/run/steps.csv" $column)
        assert_success
    done
    # the scale moved during the run (window 2), so carrying it over is what made the difference
    [ "$(csv_column "$(scratch)/whole/steps.csv" loss_scale | sort -u | wc -l)" -gt 1 ]
}

@test "16 bits in chapters 03-06: fp16 through the pipeline resumes bit for bit, scale included" {
    local f="--precision fp16 --loss-scale-window 2 --pp 2"
    mpirun_np 2 "$TRAIN04" $FLAGS $f --out "$(scratch)/whole" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS $f --stop-after 3 --save "$(scratch)/ck" --out "$(scratch)/first" >/dev/null
    mpirun_np 2 "$TRAIN04" $FLAGS $f --resume "$(scratch)/ck" --out "$(scratch)/run" >/dev/null
    for column in loss loss_scale skipped; do
        run diff <(csv_column "$(scratch)/whole/steps.csv" $column | tail -3) <(csv_column "$(scratch)/run/steps.csv" $column)
        assert_success
    done
}

@test "16 bits: a bf16 ZeRO-2 checkpoint resumes in 01, 03 tensor parallel and 06, near 01's bf16 run" {
    local f="--precision bf16"
    "$TRAIN01" $FLAGS $f --out "$(scratch)/whole" >/dev/null
    mpirun_np 2 "$TRAIN05" $FLAGS $f --zero 2 --stop-after 3 --save "$(scratch)/ck" --out "$(scratch)/first" >/dev/null
    "$TRAIN01" $FLAGS $f --resume "$(scratch)/ck" --out "$(scratch)/one" >/dev/null
    mpirun_np 2 "$TRAIN03" $FLAGS $f --mp tensor --resume "$(scratch)/ck" --out "$(scratch)/tp" >/dev/null
    "$TRAIN06" $FLAGS $f --offload --resume "$(scratch)/ck" --out "$(scratch)/six" >/dev/null
    # 1e-3: the layouts round differently in bf16 (measured: a few 1e-6); weights not restored
    # from the master weights would be off by percents (step 4's loss is 3% below step 1's)
    mkdir "$(scratch)/ref" # steps 4-6 of the uninterrupted run, to set beside the resumed ones
    { echo loss; csv_column "$(scratch)/whole/steps.csv" loss | tail -3; } >"$(scratch)/ref/steps.csv"
    for run in one tp six; do assert_losses_within "$(scratch)/ref" "$(scratch)/$run" 3 1e-3; done
}

@test "any precision resumes any other: fp32 -> fp16 starts the scale afresh, saying so; fp16 -> bf16" {
    run "$TRAIN01" $FLAGS --precision fp16 --resume "$CK/ck01" --stop-after 4 --save "$(scratch)/ck" --out "$(scratch)/a"
    assert_success
    assert_output --partial "the checkpoint was written by a fp32 run: fp16's dynamic loss scale starts afresh at 65536"
    "$TRAIN01" $FLAGS --precision bf16 --resume "$(scratch)/ck" --out "$(scratch)/b" >/dev/null
    assert_equal "$(csv_column "$(scratch)/b/steps.csv" step | tr '\n' ' ')" "5 6 "
}

# ---- saving ----

@test "--save-every 2 saves at steps 2, 4 and 6, each replacing the last, with one run-info line" {
    run "$TRAIN01" $FLAGS --save "$(scratch)/ck" --save-every 2 --out "$(scratch)/out"
    assert_success
    assert_equal "$(grep -o 'saved checkpoint .* at step [0-9]*' <<<"$output" | awk '{ print $NF }' | tr '\n' ' ')" "2 4 6 "
    assert_equal "$(grep -c '^checkpoint ' "$(scratch)/out/run-info.txt")" 1
    grep -q "^checkpoint $(checksum_of "$(scratch)/ck") step 6 " "$(scratch)/out/run-info.txt"
    [ ! -e "$(scratch)/ck.tmp" ]
}

@test "--save-every without --save is refused" {
    run --separate-stderr "$TRAIN01" $FLAGS --save-every 2 --out "$(scratch)/out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --save-every 2 needs --save PATH (where to write the checkpoints)"
}

# ---- common/ckpt ----

@test "common/ckpt prints the header, the writer's layout, the step and every tensor" {
    run "$CKPT" "$CK/ck05"
    assert_success
    assert_line --regexp "^format      version 4, checksum [0-9a-f]{16} \(verified\)$"
    assert_line "writer      05_zero/train: 2 ranks, zero 3"
    assert_line --partial "step        3 of 6 (Adam updates 3)"
    assert_line --regexp "^h1.fcprojw +1 +64 x 256 +[0-9]+$"
    assert_equal "$(grep -c '^h[01]\.' <<<"$output")" 24
    run "$CKPT" --help
    assert_success
    assert_output --partial "export PATH OUT"
}

@test "06 --offload --pp 2 --tp 2 names every axis of its layout in common/ckpt and a safetensors export; 05 its ZeRO stage" {
    local d
    d="$(scratch)"
    mpirun_np 4 "$TRAIN06" $FLAGS --steps 1 --offload --pp 2 --tp 2 --save "$d/ck" --out "$d/six" >/dev/null
    run "$CKPT" "$d/ck"
    assert_success
    assert_line "writer      06_offload/train: pp 2 x tp 2 x dp 1, 1f1b, offload"
    "$CKPT" export "$d/ck" "$d/model.safetensors"
    run python3 "$REPO/tests/safetensors_check.py" "$d/model.safetensors" "$d/ck" 2 64 256 64
    assert_success
    assert_line "writer 06_offload/train: pp 2 x tp 2 x dp 1, 1f1b, offload"
    run "$CKPT" "$CK/ck06" # 2 stages x 2 replicas
    assert_line "writer      06_offload/train: pp 2 x tp 1 x dp 2, 1f1b, offload"
    mpirun_np 2 "$TRAIN05" $FLAGS --steps 1 --pp 2 --zero 1 --save "$d/ck05" --out "$d/five" >/dev/null
    run "$CKPT" "$d/ck05"
    assert_line "writer      05_zero/train: pp 2 x tp 1 x dp 1, 1f1b, zero 1"
}

@test "common/ckpt export writes safetensors that a parser of our own (or safetensors.torch) reads back" {
    run "$CKPT" export "$CK/ck04" "$(scratch)/model.safetensors"
    assert_success
    run python3 "$REPO/tests/safetensors_check.py" "$(scratch)/model.safetensors" "$CK/ck04" 2 64 256 64
    assert_success
    assert_line "writer 04_pipeline/train: pp 2 x tp 1 x dp 1, 1f1b"
    assert_output --partial "ok 29 tensors"
    "$CKPT" export "$CK/ck04" "$(scratch)/all.safetensors" --optimizer
    python3 -c 'import json, struct, sys
blob = open(sys.argv[1], "rb").read(); (n,) = struct.unpack_from("<Q", blob)
names = json.loads(blob[8:8 + n]); assert len(names) == 1 + 3 * 29 and "adam_v.lm_head" in names, len(names)' \
        "$(scratch)/all.safetensors"
}

# ---- refused ----

# Resume with a one-line stderr and exit 2 expected: $1 is the message's part.
resume() {
    run --separate-stderr timeout 10 "$TRAIN01" $FLAGS --out "$(scratch)/out" "$@"
}
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

# flip FILE OFFSET BITS: XOR one byte (a negative offset counts from the end)
flip() {
    python3 -c 'import sys
path, offset, bits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = bytearray(open(path, "rb").read()); data[offset] ^= bits; open(path, "wb").write(data)' "$@"
}

@test "a flipped exponent bit in a parameter is refused by the checksum, by training and by common/ckpt" {
    cp "$CK/ck01" "$(scratch)/ck"
    flip "$(scratch)/ck" $((4096 + 4 * 100 + 3)) 64 # parameter 100 (the arrays start at byte 4096)
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: checksum"
    run --separate-stderr "$CKPT" verify "$(scratch)/ck"
    assert_equal "$status" 2
    [[ "$stderr" == *"corrupt checkpoint: checksum"* ]]
}

@test "a flipped bit in Adam's second moment is refused too" {
    cp "$CK/ck05" "$(scratch)/ck"
    flip "$(scratch)/ck" -5 1
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: checksum"
}

@test "header fields out of range are refused, naming the field: adam_t, step, lr" {
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" 116 i -5
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: adam_t -5 (valid: 0..3)"
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" 112 i -1
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: step -1 (valid: 0..6)"
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" 88 f nan
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: lr nan"
}

@test "a directory entry that does not describe the model is refused as corrupt" {
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" $((240 + 64 * 4 + 40)) i 65 # h0.qkvw's cols (entries: name[32], layer, rows, cols)
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "corrupt checkpoint: tensor 4 is 'h0.qkvw' (192 x 65 at 20608), the model's is 'h0.qkvw' (192 x 64 at 20608)"
}

@test "a truncated checkpoint, a longer one, and one of another model are refused" {
    head -c 5000 "$CK/ck01" >"$(scratch)/cut"
    resume --resume "$(scratch)/cut"
    assert_refused_checkpoint "the file is truncated (5000 of 1647616 bytes)"
    cat "$CK/ck01" "$CK/ck01" >"$(scratch)/long"
    resume --resume "$(scratch)/long"
    assert_refused_checkpoint "3295232 bytes where a checkpoint of this model has 1647616"
    resume --layers 3 --resume "$CK/ck01"
    assert_refused_checkpoint "written for a different model (layers 2, dmodel 64, heads 4, seq 64, vocab 256); this run has layers 3"
}

@test "a checkpoint of the old format (version 2) is refused naming the versions" {
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" 8 I 2
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "checkpoint format version 2, this program reads version 4"
}

@test "resuming with nothing left to do, or --stop-after before the checkpoint, is refused and saves nothing" {
    resume --steps 3 --resume "$CK/ck01"
    assert_refused_checkpoint "the checkpoint is at step 3 and --steps is 3: nothing to do"
    resume --stop-after 2 --resume "$CK/ck01" --save "$(scratch)/ck2"
    assert_refused_checkpoint "--stop-after 2 is not after the checkpoint's step 3 (valid: --stop-after 4..6)"
    [ ! -e "$(scratch)/ck2" ]
}

@test "an unwritable --save path and a missing directory are refused before training, nothing overwritten" {
    resume --save /proc/ck
    assert_refused_checkpoint "--save /proc/ck: cannot create a file in the directory /proc"
    resume --save "$(scratch)/nowhere/ck"
    assert_refused_checkpoint "--save $(scratch)/nowhere/ck: the directory $(scratch)/nowhere does not exist"
    # a refused run leaves an earlier checkpoint at its --save path alone
    cp "$CK/ck01" "$(scratch)/ck"
    resume --resume "$(scratch)/ck" --steps 3 --save "$(scratch)/ck"
    assert_refused_checkpoint "nothing to do"
    cmp "$CK/ck01" "$(scratch)/ck"
}

@test "common/ckpt refuses a file that is not a checkpoint, and a bad command, with one line and exit 2" {
    printf 'this is not a checkpoint at all, just text\n' >"$(scratch)/text"
    run --separate-stderr "$CKPT" "$(scratch)/text"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: $(scratch)/text: not a checkpoint of this course (wrong magic bytes)"
    run --separate-stderr "$CKPT" export "$CK/ck01"
    assert_equal "$status" 2
    run --separate-stderr "$CKPT" export "$CK/ck01" "$(scratch)/nowhere/x.safetensors"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export $(scratch)/nowhere/x.safetensors: the directory $(scratch)/nowhere does not exist"
}

# ---- nothing lost: --save and common/ckpt export never destroy a file ----

# md5 of each file named, in one line: to show a refused command left them alone
sums() { md5sum "$@" | awk '{ print $1 }' | tr '\n' ' '; }

@test "--save refuses a file that is not a checkpoint, the --data file and the run's own output files; an earlier checkpoint may be replaced" {
    local d
    d="$(scratch)"
    printf 'twenty kilobytes of notes, say\n' >"$d/notes.txt"
    ln -s "$CK/corpus.txt" "$d/corpus-alias" # the --data file under another name
    mkdir "$d/run"
    printf 'step,loss\n' >"$d/run/steps.csv"
    local before
    before="$(sums "$d/notes.txt" "$CK/corpus.txt" "$d/run/steps.csv")"
    resume --save "$d/notes.txt"
    assert_refused_checkpoint "--save $d/notes.txt: exists and is not a checkpoint of this course (valid: a new name or an earlier checkpoint)"
    resume --save "$d/corpus-alias"
    assert_refused_checkpoint "--save $d/corpus-alias: is the --data file $CK/corpus.txt (valid: a new name or an earlier checkpoint)"
    ln -s "$CK/corpus.txt" "$d/corpus.tmp" # a save writes PATH.tmp first
    resume --save "$d/corpus"
    assert_refused_checkpoint "--save $d/corpus: its temporary file $d/corpus.tmp is the --data file $CK/corpus.txt"
    run --separate-stderr timeout 10 "$TRAIN01" $FLAGS --out "$d/run" --overwrite --save "$d/run/steps.csv"
    assert_refused_checkpoint "--save $d/run/steps.csv: is steps.csv, a file this run writes into --out $d/run (valid: a name that is not one of the run's files)"
    # the same file by another spelling, and one the run has not written yet
    run --separate-stderr timeout 10 "$TRAIN01" $FLAGS --out "$d/run" --overwrite --save "$d/run/../run/run.csv"
    assert_refused_checkpoint "--save $d/run/../run/run.csv: is run.csv, a file this run writes into --out $d/run"
    [ ! -e "$d/run/run.csv" ]
    # every chapter checks it (the multi-rank ones on every rank, one line for the job)
    run --separate-stderr mpirun_np 2 "$TRAIN05" $FLAGS --zero 3 --out "$d/out05" --save "$d/notes.txt"
    assert_equal "$status" 2
    assert_equal "$(grep '^error:' <<<"$stderr")" "error: --save $d/notes.txt: exists and is not a checkpoint of this course (valid: a new name or an earlier checkpoint)"
    assert_equal "$(sums "$d/notes.txt" "$CK/corpus.txt" "$d/run/steps.csv")" "$before"
    # an earlier checkpoint is what --save may replace
    cp "$CK/ck01" "$d/ck"
    run timeout 60 "$TRAIN01" $FLAGS --out "$d/again" --stop-after 2 --save "$d/ck"
    assert_success
    run "$CKPT" verify "$d/ck"
    assert_output --partial "step 2 $d/ck"
}

@test "a refused run leaves no --out directory behind, even when the ranks refuse together after checking it" {
    local d
    d="$(scratch)"
    run --separate-stderr timeout 10 "$TRAIN01" $FLAGS --out "$d/new/out" --resume "$d/missing"
    assert_equal "$status" 2
    [ ! -e "$d/new" ]
    # every rank checked --out (and made it, before): then they disagree on --steps
    run --separate-stderr mpirun_np 1 "$TRAIN02" $FLAGS --out "$d/new/out" : \
        -np 1 "$TRAIN02" $FLAGS --steps 5 --out "$d/new/out"
    assert_equal "$status" 2
    [[ "$stderr" == *"the ranks disagree on --steps"* ]]
    [ ! -e "$d/new" ]
}

@test "common/ckpt export refuses OUT when it is IN, an earlier checkpoint, a directory or not a regular file, and changes none of them" {
    local d="$BATS_TEST_TMPDIR/files"
    mkdir "$d"
    cp "$CK/ck01" "$d/ck"
    ln "$d/ck" "$d/ck-link" # IN under another name
    cp "$CK/ck02" "$d/other"
    mkdir "$d/dir"
    mkfifo "$d/fifo"
    ln -s /dev/null "$d/null" # what /dev/null would see, without risking /dev/null
    local before
    before="$(sums "$d/ck" "$d/other")"
    run --separate-stderr timeout 10 "$CKPT" export "$d/ck" "$d/ck-link"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export $d/ck-link: is the checkpoint being exported (valid: a new file name)"
    run --separate-stderr timeout 10 "$CKPT" export "$d/ck" "$d/other"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export $d/other: exists and is not a safetensors export of common/ckpt (valid: a new name or an earlier export)"
    run --separate-stderr timeout 10 "$CKPT" export "$d/ck" "$d/dir"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export $d/dir: is a directory (valid: a file name)"
    for out in fifo null; do
        run --separate-stderr timeout 10 "$CKPT" export "$d/ck" "$d/$out"
        assert_equal "$status" 2
        assert_equal "$stderr" "error: export $d/$out: not a regular file (valid: a new name or an earlier export)"
    done
    assert_equal "$(sums "$d/ck" "$d/other")" "$before"
    [ -p "$d/fifo" ] && [ -L "$d/null" ] && [ -c /dev/null ]
    [ -z "$(ls -A "$d/dir")" ]
    # an earlier export is replaced, and no temporary file stays behind
    "$CKPT" export "$d/ck" "$d/model.safetensors"
    run "$CKPT" export "$d/ck" "$d/model.safetensors"
    assert_success
    assert_equal "$(ls "$d" | tr '\n' ' ')" "ck ck-link dir fifo model.safetensors null other "
}

@test "the writer text's bytes that are not UTF-8 are escaped in an export, and Python's json reads the header" {
    cp "$CK/ck01" "$(scratch)/ck"
    python3 -c 'import sys
path = sys.argv[1]; data = bytearray(open(path, "rb").read())
text = b"05\xffbad \xc3\xa9t\xc3 \xe2\x82\xac\x00"   # invalid 0xff, valid e-acute, a cut sequence, a valid euro sign
data[136:136 + len(text)] = text; open(path, "wb").write(data)' "$(scratch)/ck"
    run "$CKPT" verify "$(scratch)/ck" # the writer text is outside the checksum
    assert_success
    "$CKPT" export "$(scratch)/ck" "$(scratch)/model.safetensors"
    run python3 -c 'import json, struct, sys
blob = open(sys.argv[1], "rb").read(); (n,) = struct.unpack_from("<Q", blob)
print(ascii(json.loads(blob[8:8 + n].decode("utf-8"))["__metadata__"]["writer"]))' "$(scratch)/model.safetensors"
    assert_success
    assert_output "'05\\xffbad \\xe9t\\xc3 \\u20ac'"
}

@test "a header whose head count does not divide the width is refused by ckpt verify and by --resume" {
    cp "$CK/ck01" "$(scratch)/ck"
    patch "$(scratch)/ck" 24 i 5 # heads (dmodel is 64)
    run --separate-stderr "$CKPT" verify "$(scratch)/ck"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: $(scratch)/ck: corrupt checkpoint: its model shape is not one this course builds: --dmodel 64 is not divisible by --heads 5 (valid: a multiple of heads)"
    resume --resume "$(scratch)/ck"
    assert_refused_checkpoint "--resume $(scratch)/ck: corrupt checkpoint: its model shape is not one this course builds: --dmodel 64 is not divisible by --heads 5 (valid: a multiple of heads)"
}

@test "ckpt verify: usage without a path or with --help (and export without one: the usage line); with a bad file among good ones, checks all and fails at the end" {
    run --separate-stderr "$CKPT" verify --help
    assert_success
    [[ "$output" == usage:* ]]
    run --separate-stderr "$CKPT" verify
    assert_equal "$status" 2
    [[ "$stderr" == *"usage:"* ]]
    [[ "$stderr" != *"cannot open"* ]]
    run --separate-stderr "$CKPT" export # not a checkpoint called "export"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: expected PATH, verify PATH, export PATH OUT [--optimizer | --format hf] or import-hf DIR OUT (see common/ckpt --help)"
    printf 'not a checkpoint\n' >"$(scratch)/bad"
    run --separate-stderr "$CKPT" verify "$CK/ck01" "$(scratch)/bad" "$CK/ck02" "$(scratch)/missing"
    assert_equal "$status" 2
    assert_equal "$(grep -c '^ok ' <<<"$output")" 2
    assert_line --index 1 --partial " step 3 $CK/ck02"
    assert_equal "$stderr" "error: $(scratch)/bad: not a checkpoint of this course (wrong magic bytes)
error: $(scratch)/missing: cannot open (No such file or directory)"
}

@test "the ranks' --save directory must be one they share: checked before training, nothing written" {
    local d="$BATS_TEST_TMPDIR/files"
    mkdir -p "$d/elsewhere"
    export COURSE_FAULT_SAVE_DIR="1:$d/elsewhere"
    run --separate-stderr mpirun_np 3 "$TRAIN02" $FLAGS --out "$d/out" --save "$d/ck"
    echo "$stderr"
    assert_equal "$status" 2
    assert_equal "$(grep -c '^error:' <<<"$stderr")" 1
    [[ "$stderr" == *"error: [rank 0] --save $d/ck: rank 1 does not see the directory $d as rank 0 does (valid: a --save directory every rank shares)"* ]]
    [ ! -e "$d/ck" ] && [ ! -e "$d/run/steps.csv" ]
    assert_equal "$(ls -A "$d" | tr '\n' ' ')" "elsewhere "
    [ -z "$(ls -A "$d/elsewhere")" ]
}

@test "a rank never writes into a temporary file rank 0 did not create for this save (a stale PATH.tmp on its side)" {
    run --separate-stderr "$BUILD/tests/test_checkpoint" "$(scratch)" stale
    assert_equal "$status" 1
    [[ "$stderr" == *"is not the file rank 0 created for this save"* ]]
    [ ! -e "$(scratch)/ck" ]
}
