#!/usr/bin/env bats
# Hugging Face interop (common/tools/ckpt_hf.c): `common/ckpt export --format hf`
# writes a transformers GPT2LMHeadModel (model.safetensors + config.json) and
# `common/ckpt import-hf` reads one back into a course checkpoint at step 0.
# Checked here without torch by tests/hf_check.py (json + struct), and with
# torch and transformers, where importable (`make interop` installs them), by
# tests/hf_torch_check.py: the same logits both ways, and an imported model
# that trains in 01 and 04 --pp 2 from transformers' loss.

load ../helpers

CKPT="$REPO/common/ckpt"
CHECK="$REPO/tests/hf_check.py"
FLAGS="--device cpu --model tiny --batch 4 --sample 0 --quiet --data $BATS_FILE_TMPDIR/corpus.txt"
export OMP_NUM_THREADS=1

# A tiny model three steps in (its weights no longer the initial ones).
setup_file() {
    cp "$REPO/course.md" "$BATS_FILE_TMPDIR/corpus.txt"
    "$TRAIN01" $FLAGS --steps 3 --out "$BATS_FILE_TMPDIR/run" --save "$BATS_FILE_TMPDIR/a.ckpt" >/dev/null
}
A="$BATS_FILE_TMPDIR/a.ckpt"

@test "export --format hf of a tied checkpoint says tie_word_embeddings and writes no lm_head.weight" {
    local d="$(scratch)"
    "$TRAIN01" $FLAGS --steps 1 --tie-embeddings --out "$d/run" --save "$d/t.ckpt" >/dev/null
    run "$CKPT" export "$d/t.ckpt" "$d/hf" --format hf
    assert_success
    grep -q '"tie_word_embeddings": *true' "$d/hf/config.json"
    grep -aq 'transformer.wte.weight' "$d/hf/model.safetensors"
    ! grep -aq 'lm_head.weight' "$d/hf/model.safetensors"
    "$CKPT" export "$A" "$d/hf-untied" --format hf >/dev/null
    grep -q '"tie_word_embeddings": *false' "$d/hf-untied/config.json"
    grep -aq 'lm_head.weight' "$d/hf-untied/model.safetensors"
}

@test "export --format hf: GPT-2's names and shapes, Conv1D's matrices transposed, the checkpoint's values, config.json's shape and choices" {
    run "$CKPT" export "$A" "$(scratch)/hf" --format hf
    assert_success
    assert_output "exported 29 tensors (136960 parameters) of $A, step 3, as a transformers GPT2LMHeadModel to $(scratch)/hf (model.safetensors, config.json)"
    run python3 "$CHECK" export "$(scratch)/hf" "$A"
    assert_success
    assert_output "ok 29 tensors"
    # again into its own earlier export: replaced, the same bytes
    cp -r "$(scratch)/hf" "$(scratch)/before"
    "$CKPT" export "$A" "$(scratch)/hf" --format hf >/dev/null
    cmp "$(scratch)/hf/model.safetensors" "$(scratch)/before/model.safetensors"
    cmp "$(scratch)/hf/config.json" "$(scratch)/before/config.json"
}

@test "import-hf: course -> Hugging Face's layout (written in Python) -> course gives the weights back bit for bit, F16 and BF16 rounded as they store them, at step 0 with zero moments" {
    local d="$(scratch)" dtype
    for dtype in F32 F16 BF16; do
        python3 "$CHECK" synth "$A" "$d/$dtype" --dtype "$dtype" --mask-buffers >/dev/null
        run "$CKPT" import-hf "$d/$dtype" "$d/$dtype.ckpt"
        assert_success
        assert_output --partial "imported 29 tensors (136960 parameters) of $d/$dtype into $d/$dtype.ckpt (step 0,"
        run python3 "$CHECK" same "$A" "$d/$dtype.ckpt" --dtype "$dtype"
        assert_success
        [ "$dtype" != F32 ] || assert_output "ok 136960 parameters bit for bit"
    done
    # GPT-2's own upload names the base model's tensors without "transformer."
    python3 "$CHECK" synth "$A" "$d/bare" --bare-names >/dev/null
    "$CKPT" import-hf "$d/bare" "$d/bare.ckpt" >/dev/null
    run python3 "$CHECK" same "$A" "$d/bare.ckpt"
    assert_output "ok 136960 parameters bit for bit"
    # and common/ckpt's own export imports to the same checkpoint
    "$CKPT" export "$A" "$d/exported" --format hf >/dev/null
    "$CKPT" import-hf "$d/exported" "$d/again.ckpt" >/dev/null
    assert_equal "$("$CKPT" verify "$d/again.ckpt" | cut -d' ' -f2)" "$("$CKPT" verify "$d/F32.ckpt" | cut -d' ' -f2)"
}

@test "an imported checkpoint resumes as a fresh run from its weights in 01 and in 04 --pp 2, with the same losses" {
    local d="$(scratch)"
    python3 "$CHECK" synth "$A" "$d/hf" >/dev/null
    "$CKPT" import-hf "$d/hf" "$d/in.ckpt" >/dev/null
    # --batch 4, not the import's recorded 8: a fresh start has no curve to differ from, so no note
    run "$TRAIN01" $FLAGS --steps 3 --resume "$d/in.ckpt" --out "$d/one"
    assert_success
    refute_output --partial "note: resuming with different training flags"
    mpirun_np 2 "$TRAIN04" $FLAGS --steps 3 --pp 2 --resume "$d/in.ckpt" --out "$d/pp" >/dev/null
    assert_equal "$(csv_column "$d/one/steps.csv" step | tr '\n' ' ')" "1 2 3 "
    assert_losses_within "$d/one" "$d/pp" 3 1e-5
    # the first loss is that of the weights imported (3 steps in), not of fresh ones
    local fresh="$(csv_column "$BATS_FILE_TMPDIR/run/steps.csv" loss | head -1)"
    local first="$(csv_column "$d/one/steps.csv" loss | head -1)"
    awk -v a="$fresh" -v b="$first" 'BEGIN { exit !(b < a - 0.01) }'
}

@test "import-hf of tied weights (GPT-2's own choice) gives a tied checkpoint: bit for bit through export and back, lm_head.weight not read where a file keeps it, resumed by 01 --tie-embeddings" {
    local d="$(scratch)"
    "$TRAIN01" $FLAGS --steps 2 --tie-embeddings --out "$d/run" --save "$d/tied.ckpt" >/dev/null
    "$CKPT" export "$d/tied.ckpt" "$d/hf" --format hf >/dev/null
    run "$CKPT" import-hf "$d/hf" "$d/back.ckpt"
    assert_success
    assert_output --partial "imported 28 tensors (120576 parameters) of $d/hf into $d/back.ckpt (step 0,"
    assert_output --partial "--vocab 256 --tie-embeddings --resume $d/back.ckpt"
    run python3 "$CHECK" same "$d/tied.ckpt" "$d/back.ckpt"
    assert_output "ok 120576 parameters bit for bit"
    run "$TRAIN01" $FLAGS --steps 1 --tie-embeddings --resume "$d/back.ckpt" --out "$d/resumed"
    assert_success
    # a file that says tied but still holds lm_head.weight (an untied model's, here): the head is wte
    python3 "$CHECK" synth "$A" "$d/kept" --config tie_word_embeddings=true >/dev/null
    run "$CKPT" import-hf "$d/kept" "$d/kept.ckpt"
    assert_success
    assert_output --partial "imported 28 tensors (120576 parameters)"
}

@test "import-hf refuses, in one line and exit 2, what the course's GPT cannot hold, and writes nothing" {
    local d="$(scratch)" fault message count=0 at
    while IFS='|' read -r fault message; do
        count=$((count + 1)) && at="$d/f$count"
        eval python3 "$CHECK" synth "$A" "$at" $fault </dev/null >/dev/null
        run --separate-stderr "$CKPT" import-hf "$at" "$at.ckpt" </dev/null
        echo "$fault: status $status, stderr $stderr"
        assert_equal "$status" 2
        assert_equal "$(printf '%s\n' "$stderr" | grep -c .)" 1
        assert_equal "$stderr" "error: import-hf: $at/$message"
        [ ! -e "$at.ckpt" ]
    done <<'EOF'
--config activation_function='"relu"'|config.json: activation_function 'relu': the course's GPT computes GELU's tanh form only (valid: gelu_new or gelu_pytorch_tanh)
--config layer_norm_epsilon=1e-6|config.json: layer_norm_epsilon 1e-06: the course's layernorm uses 1e-05 (valid: 1e-05)
--config n_inner=100|config.json: n_inner 100: the course's MLP is 4 x n_embd wide (valid: null or 256)
--config scale_attn_by_inverse_layer_idx=true|config.json: attention scores scaled otherwise than by 1/sqrt(head size) (valid: scale_attn_weights true, scale_attn_by_inverse_layer_idx false)
--config model_type='"gpt_neo"'|config.json: model_type 'gpt_neo' (valid: gpt2)
--config n_head=5|config.json: a model the course cannot build: --dmodel 64 is not divisible by --heads 5 (valid: a multiple of heads)
--drop transformer.h.1.mlp.c_fc.bias|model.safetensors: no tensor transformer.h.1.mlp.c_fc.bias (the model of config.json has one)
--drop lm_head.weight|model.safetensors: no tensor lm_head.weight (the model of config.json has one)
--transpose transformer.h.0.attn.c_attn.weight|model.safetensors: transformer.h.0.attn.c_attn.weight has shape [192, 64], config.json's model has [64, 192] there
--config vocab_size=300|model.safetensors: transformer.wte.weight has shape [256, 64], config.json's model has [300, 64] there
--config n_layer=3|model.safetensors: no tensor transformer.h.2.ln_1.weight (the model of config.json has one)
--extra transformer.h.0.attn.rotary|model.safetensors: holds transformer.h.0.attn.rotary, which a GPT-2 of config.json's shape has no place for
EOF
    assert_equal "$count" 12
    # the output-file rule: never a file that is not a checkpoint
    python3 "$CHECK" synth "$A" "$d/good" >/dev/null
    echo keep >"$d/notes.txt"
    run --separate-stderr "$CKPT" import-hf "$d/good" "$d/notes.txt"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: import-hf $d/notes.txt: exists and is not a checkpoint of this course (valid: a new name or an earlier checkpoint)"
    assert_equal "$(cat "$d/notes.txt")" keep
    run --separate-stderr "$CKPT" import-hf "$d/nothing" "$d/x.ckpt"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: import-hf $d/nothing: not a directory (valid: a directory with config.json and model.safetensors)"
}

@test "export --format hf writes only a new directory or its own earlier export, and changes nothing else" {
    local d="$(scratch)"
    mkdir "$d/busy" && echo keep >"$d/busy/notes.txt"
    run --separate-stderr "$CKPT" export "$A" "$d/busy" --format hf
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export --format hf $d/busy: holds notes.txt, which is not an earlier export's (valid: a new directory or an earlier export's)"
    assert_equal "$(ls "$d/busy")" notes.txt
    # a config.json of someone else's beside an export of ours
    "$CKPT" export "$A" "$d/ours" --format hf >/dev/null
    echo '{"model_type": "gpt2"}' >"$d/ours/config.json"
    run --separate-stderr "$CKPT" export "$A" "$d/ours" --format hf
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export --format hf $d/ours: holds config.json, which is not an earlier export's (valid: a new directory or an earlier export's)"
    assert_equal "$(cat "$d/ours/config.json")" '{"model_type": "gpt2"}'
    echo keep >"$d/file"
    run --separate-stderr "$CKPT" export "$A" "$d/file" --format hf
    assert_equal "$stderr" "error: export --format hf $d/file: exists and is not a directory (valid: a new directory or an earlier export's)"
    run --separate-stderr "$CKPT" export "$A" "$d/no/such" --format hf
    assert_equal "$stderr" "error: export --format hf $d/no/such: the directory $d/no does not exist"
    run --separate-stderr "$CKPT" export "$A" "$d/new" --format hf --optimizer
    assert_equal "$stderr" "error: export: --optimizer with --format hf (valid: --format safetensors: a Hugging Face model holds the weights only)"
    run --separate-stderr "$CKPT" export "$A" "$d/new" --format onnx
    assert_equal "$status" 2
    assert_equal "$stderr" "error: export: --format 'onnx' (valid: safetensors or hf)"
    [ ! -e "$d/new" ]
}

@test "transformers' GPT2LMHeadModel and the course compute the same logits both ways, and a save_pretrained model imported trains in 01 and 04 --pp 2 from transformers' loss" {
    local python=python3
    [ -x "$REPO/build/venv-interop/bin/python" ] && python="$REPO/build/venv-interop/bin/python"
    "$python" -c 'import torch, transformers' 2>/dev/null ||
        skip "torch and transformers are not importable: not compared (make interop installs them)"
    run env TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 \
        "$python" "$REPO/tests/hf_torch_check.py" "$REPO" "$(scratch)"
    echo "$output"
    assert_success
    assert_line --regexp "^ok export \(common/ckpt export --format hf, from_pretrained\): logits within "
    assert_line --regexp "^ok import \(save_pretrained, common/ckpt import-hf\): logits within "
    assert_line --regexp "^ok 01 trains the import: first loss "
    assert_line --regexp "^ok 04 --pp 2 trains the import: first loss "
}
