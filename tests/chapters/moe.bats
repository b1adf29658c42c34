#!/usr/bin/env bats
# The mixture-of-experts model (--experts E --top-k K, common/model/moe.h):
# its gradients (router, experts, balancing loss, with and without capacity
# drops) against finite differences; chapter 01 trains it, with odd E, K = 1
# and 2, and reports each step's routing in steps.csv; 02's data parallelism
# gives 01's losses and routing; checkpoints save and resume it; the planner
# predicts its memory.csv; bad flags and chapters that do not train it yet
# are refused in one line (03's expert parallelism: expert_parallel.bats);
# 04's pipeline stages give 01's losses and routing with every schedule, and
# so do 05's ZeRO and 06's offloaded optimizer.

load ../helpers

FLAGS="--device cpu --model tiny --steps 8 --batch 4 --sample 0 --quiet --eval-batches 1 --data $BATS_FILE_TMPDIR/corpus.txt"

setup_file() {
    cp "$REPO/tests/fixtures/text.txt" "$BATS_FILE_TMPDIR/corpus.txt" # fixed: course.md changes with every edit
}

# grad_check ARGS...: test_model_grad with ARGS on a fixed seed: every tensor's gradient matches
grad_check() {
    run "$BUILD/tests/test_model_grad" --seed 1 "$@"
    assert_success
    assert_output --partial "0 of 31 tensors failed"
    refute_line --regexp "^FAIL"
}

@test "MoE gradients (router through the top-2 gates, 3 experts, dropless) match finite differences" {
    grad_check --experts 3 --top-k 2 --aux-loss-coef 0
    assert_line --regexp "^PASS h0.routerw "
    assert_line --regexp "^PASS h1.moe_fcw "
}

@test "MoE gradients of the balancing loss (top-1: the router learns from it alone) match finite differences" {
    grad_check --experts 3 --top-k 1 --aux-loss-coef 1
    assert_line --regexp "^experts 3, top-k 1, capacity factor 0, aux coef 1: 78 choices computed, 0 dropped"
}

@test "MoE gradients with capacity drops (5 experts, top-2, factor 0.5) match finite differences" {
    grad_check --experts 5 --top-k 2 --capacity-factor 0.5 --aux-loss-coef 0.3
    # drops happened: fewer than the 3 x 13 x 2 choices of each of the 2 blocks were computed
    assert_line --regexp "^experts 5, top-k 2, capacity factor 0.5, aux coef 0.3: [0-9]+ choices computed, [1-9][0-9]* dropped"
}

# routing_adds_up DIR K BLOCKS: every step's tokens_e* columns sum to the step's
# tokens x K x MoE blocks less its dropped column; prints the total dropped
routing_adds_up() {
    local dir="$1" k="$2" blocks="$3" tokens
    tokens=$((4 * 64)) # --batch 4 sequences of the tiny preset's 64 tokens
    awk -F, -v want=$((tokens * k * blocks)) '
        NR == 1 { for (i = 1; i <= NF; i++) { if ($i ~ /^tokens_e/) col[i] = 1; if ($i == "dropped") d = i } next }
        { s = 0; for (i in col) s += $i; if (s + $d != want) { print "step " $1 ": " s " + " $d " != " want; bad = 1 }
          dropped += $d; rows++ }
        END { if (rows == 0 || d == 0 || length(col) == 0) { print "no routing columns"; exit 1 }
              print dropped; exit bad }' "$dir/steps.csv"
}

# loss_falls DIR: the last step's loss is below the first's
loss_falls() {
    awk -F, 'NR == 2 { first = $2 } NR > 1 { last = $2 } END { if (!(last < first - 0.3)) { print first " -> " last; exit 1 } }' \
        "$1/steps.csv"
}

@test "01 trains 3 experts with top-1 and capacity drops: the loss falls, the routing columns add up" {
    run "$TRAIN01" $FLAGS --experts 3 --top-k 1 --capacity-factor 1 --out "$(scratch)/r"
    assert_success
    run head -n 1 "$(scratch)/r/steps.csv"
    assert_output "step,loss,lr,grad_norm,step_ms,fwd_ms,bwd_ms,comm_ms,opt_ms,tokens_per_s,val_loss,aux_loss,dropped,tokens_e0,tokens_e1,tokens_e2"
    run routing_adds_up "$(scratch)/r" 1 2
    assert_success
    [ "$output" -gt 0 ] # some choices were past capacity
    run loss_falls "$(scratch)/r"
    assert_success
}

@test "01 trains 5 experts with top-2 dropless on every other block: nothing dropped, the columns add up" {
    run "$TRAIN01" $FLAGS --layers 4 --experts 5 --top-k 2 --moe-every 2 --out "$(scratch)/r"
    assert_success
    # dense tiny with 4 blocks: 236928; each MoE block adds 4 experts' MLPs (8C^2 + 5C each) and a router (5C)
    assert_output --partial "| 502272 parameters |"
    run routing_adds_up "$(scratch)/r" 2 2
    assert_success
    assert_output 0
    run loss_falls "$(scratch)/r"
    assert_success
    # the balancing term is reported, near its balanced value (aux coef 0.01 x 2 blocks)
    run csv_column "$(scratch)/r/steps.csv" aux_loss
    awk '{ if (!($1 > 0.015 && $1 < 0.1)) { print; exit 1 } }' <<<"$output"
}

@test "02 on 2 ranks gives 01's losses and routing for 3 experts, top-2, with capacity drops" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1 --steps 5"
    "$TRAIN01" $FLAGS $moe --out "$(scratch)/ref" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN02" $FLAGS $moe --out "$(scratch)/dp" >/dev/null
    assert_losses_match "$(scratch)/ref" "$(scratch)/dp" 5
    for column in dropped tokens_e0 tokens_e1 tokens_e2; do
        assert_equal "$column $(csv_column "$(scratch)/dp/steps.csv" $column | tr '\n' ' ')" \
            "$column $(csv_column "$(scratch)/ref/steps.csv" $column | tr '\n' ' ')"
    done
    [ "$(csv_column "$(scratch)/ref/steps.csv" dropped | paste -sd+ | bc)" -gt 0 ]
}

@test "02 on 3 ranks with 2 micro-batches and overlapped buckets gives 01's losses and routing (5 experts, top-1)" {
    local moe="--experts 5 --top-k 1 --capacity-factor 1.5 --aux-loss-coef 0.1 --steps 4 --batch 6 --micro 2"
    "$TRAIN01" $FLAGS $moe --out "$(scratch)/ref" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 3 "$TRAIN02" $FLAGS $moe --dp-mode overlap --bucket-mb 0.05 --out "$(scratch)/dp" >/dev/null
    assert_losses_match "$(scratch)/ref" "$(scratch)/dp" 4
    assert_column_match grad_norm "$(scratch)/ref" "$(scratch)/dp" 4
    for column in aux_loss dropped tokens_e0 tokens_e4; do
        assert_equal "$column $(csv_column "$(scratch)/dp/steps.csv" $column | tr '\n' ' ')" \
            "$column $(csv_column "$(scratch)/ref/steps.csv" $column | tr '\n' ' ')"
    done
}

@test "bf16 and fp16 MoE runs are 16-bit runs that follow fp32's losses within 1e-3" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1.25"
    "$TRAIN01" $FLAGS $moe --out "$(scratch)/fp32" >/dev/null
    for precision in bf16 fp16; do
        "$TRAIN01" $FLAGS $moe --precision $precision --out "$(scratch)/$precision" >/dev/null
        assert_losses_within "$(scratch)/fp32" "$(scratch)/$precision" 8 1e-3
        # and not fp32's bits: the matmuls did see 16-bit values
        [ "$(csv_column "$(scratch)/fp32/steps.csv" loss | tail -1)" != "$(csv_column "$(scratch)/$precision/steps.csv" loss | tail -1)" ]
    done
}

@test "an MoE run resumed from its checkpoint continues the uninterrupted run's losses" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1.25"
    "$TRAIN01" $FLAGS $moe --out "$(scratch)/whole" >/dev/null
    "$TRAIN01" $FLAGS $moe --stop-after 4 --save "$(scratch)/moe.ckpt" --out "$(scratch)/part" >/dev/null
    run "$TRAIN01" $FLAGS $moe --resume "$(scratch)/moe.ckpt" --out "$(scratch)/part"
    assert_success
    assert_losses_match "$(scratch)/whole" "$(scratch)/part" 8
    # any chapter resumes it: 02 on 2 ranks continues with steps 5-8 of the whole run
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN02" $FLAGS $moe --resume "$(scratch)/moe.ckpt" --out "$(scratch)/dp" >/dev/null
    run paste -d, <(csv_column "$(scratch)/whole/steps.csv" loss | tail -n 4) <(csv_column "$(scratch)/dp/steps.csv" loss)
    assert_equal "$(grep -c '^[0-9.]*,[0-9.]*$' <<<"$output")" 4
    awk -F, '{ r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 1e-4) { print "step " NR + 4 ": " $0; bad = 1 } } END { exit bad }' <<<"$output"
}

@test "resuming a checkpoint with other --experts (or a dense one with experts) is refused in one line" {
    "$TRAIN01" $FLAGS --experts 3 --stop-after 2 --save "$(scratch)/moe.ckpt" --out "$(scratch)/a" >/dev/null
    run --separate-stderr "$TRAIN01" $FLAGS --experts 5 --resume "$(scratch)/moe.ckpt" --out "$(scratch)/b"
    assert_failure 2
    assert_equal "$stderr" "error: --resume $(scratch)/moe.ckpt: written with --experts 3 --moe-every 1; this run has --experts 5 --moe-every 1 (valid: the same as the run that wrote it; 0 experts: the dense model)"
    run --separate-stderr "$TRAIN01" $FLAGS --resume "$(scratch)/moe.ckpt" --out "$(scratch)/c"
    assert_failure 2
    assert_equal "$(wc -l <<<"$stderr")" 1
    [[ "$stderr" == *"written with --experts 3 --moe-every 1; this run has --experts 0 --moe-every 0"* ]]
}

@test "common/ckpt names an MoE checkpoint's experts, and its Hugging Face export is refused in one line" {
    "$TRAIN01" $FLAGS --experts 3 --moe-every 2 --stop-after 1 --save "$(scratch)/moe.ckpt" --out "$(scratch)/a" >/dev/null
    run "$REPO/common/ckpt" "$(scratch)/moe.ckpt"
    assert_success
    assert_line --regexp "^model       layers 2, dmodel 64, heads 4, seq 64, vocab 256, 3 experts every 2 blocks: "
    assert_line --regexp "^h1.routerw +1 +3 x 64 "
    run --separate-stderr "$REPO/common/ckpt" export "$(scratch)/moe.ckpt" "$(scratch)/hf" --format hf
    assert_failure 2
    assert_equal "$stderr" "error: export --format hf $(scratch)/moe.ckpt: a mixture of experts (3 experts) has no GPT2LMHeadModel form (valid: a dense checkpoint)"
    [ ! -e "$(scratch)/hf" ]
}

# peak FILE SPACE CATEGORY: memory.csv's peak bytes of rank 0 in SPACE and CATEGORY
peak() { awk -F, -v s="$2" -v c="$3" '$1 == 0 && $2 == s && $3 == c { print $4 }' "$1"; }

@test "memory.csv holds the experts' activations in place of the dense hidden layer, and the routing on the host" {
    "$TRAIN01" $FLAGS --steps 1 --out "$(scratch)/dense" >/dev/null
    "$TRAIN01" $FLAGS --steps 1 --experts 3 --top-k 2 --out "$(scratch)/moe" >/dev/null
    # tiny: L = 2 MoE blocks, C = 64; N = 4 x 64 tokens, K = 2: N K = 512 choices per block
    local N=256 NK=512 C=64 E=3 B=4 f=4
    # each block: less the dense fch (N x 4C), plus the experts' inputs, hidden layers and
    # outputs (N K x (C + 4C + C)) and the rows' token, slot row and weight (N K x 3)
    local device=$(( 2 * (NK * 6 * C * f + NK * 3 * f - N * 4 * C * f) ))
    assert_equal "device activations $(( $(peak "$(scratch)/moe/memory.csv" device activations) - $(peak "$(scratch)/dense/memory.csv" device activations) ))" \
        "device activations $device"
    # the host's routing per block: probabilities (N x E), four ints or floats per choice, the
    # sequences' counts (B x E) and the experts' rows (E), each piece 64-byte aligned
    local align='function a(x) { return int((x + 63) / 64) * 64 }'
    local host=$(awk "$align"' BEGIN { print 2 * (a('$N' * '$E' * 4) + 4 * a('$NK' * 4) + a('$B' * '$E' * 4) + a('$E' * 4)) }')
    assert_equal "host activations $(peak "$(scratch)/moe/memory.csv" host activations)" "host activations $host"
}

@test "the planner's memory of an MoE run of 01 and of 02 on 2 ranks equals their memory.csv" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1 --steps 2"
    OMP_NUM_THREADS=1 "$TRAIN01" $FLAGS $moe --out "$(scratch)/one" >/dev/null
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" $FLAGS $moe --chapter 01 --out "$(scratch)/one" --csv "$(scratch)/one.csv"
    assert_success
    run diff "$(scratch)/one.csv" "$(scratch)/one/memory.csv"
    assert_success
    # the experts' buffers are there: device activations and host routing
    grep -q '^0,host,activations,[1-9]' "$(scratch)/one/memory.csv"
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN02" $FLAGS $moe --out "$(scratch)/two" >/dev/null
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" $FLAGS $moe --chapter 02 --dp 2 --out "$(scratch)/two" --csv "$(scratch)/two.csv"
    assert_success
    run diff "$(scratch)/two.csv" "$(scratch)/two/memory.csv"
    assert_success
    # in bf16 at d 128 the CPU's 16-bit matmul workspaces, whose growth must not follow the routing
    local half="--experts 3 --top-k 2 --steps 2 --precision bf16 --dmodel 128" # dropless: an expert may get every token
    OMP_NUM_THREADS=1 "$TRAIN01" $FLAGS $half --out "$(scratch)/half" >/dev/null
    run env OMP_NUM_THREADS=1 "$REPO/common/plan" $FLAGS $half --chapter 01 --out "$(scratch)/half" --csv "$(scratch)/half.csv"
    assert_success
    run diff "$(scratch)/half.csv" "$(scratch)/half/memory.csv"
    assert_success
}

# refused ARGS... MESSAGE: 01 with ARGS exits 2 with MESSAGE as its one line on stderr
refused() {
    local message="${*: -1}"
    run --separate-stderr "$TRAIN01" $FLAGS "${@:1:$#-1}" --out "$(scratch)/refused"
    assert_failure 2
    assert_equal "$stderr" "error: $message"
    [ ! -e "$(scratch)/refused/steps.csv" ]
}

@test "bad expert flags are refused in one line: K > E, E < 1, a bad coefficient, flags without --experts" {
    refused --experts 2 --top-k 3 "--top-k 3 exceeds --experts 2 (valid: 1..2)"
    refused --experts 0 "--experts: 0 is out of range (valid: 1..64)"
    refused --experts 65 "--experts: 65 is out of range (valid: 1..64)"
    refused --experts 3 --aux-loss-coef -1 "--aux-loss-coef: -1 is out of range (valid: 0..10)"
    refused --experts 3 --aux-loss-coef nan "--aux-loss-coef: 'nan' is not a number (valid: 0..10)"
    refused --experts 3 --capacity-factor -0.5 "--capacity-factor: -0.5 is out of range (valid: 0..64)"
    refused --experts 3 --moe-every 3 "--moe-every 3 exceeds --layers 2: no block would hold the experts (valid: 1..2)"
    refused --top-k 2 "--top-k needs --experts E (it shapes the mixture of experts; without it the model is dense)"
    refused --capacity-factor 1 "--capacity-factor needs --experts E (it shapes the mixture of experts; without it the model is dense)"
    refused --experts 3 --recompute "--recompute with --experts is not written yet: the experts' values are not recomputed (valid: one of them)"
}

# matches_01 PROGRAM MOE NP ARGS...: 01 and PROGRAM (on NP ranks with ARGS) train MOE's model: the
# same losses, gradient norms and routing columns (aux_loss, dropped, each expert's tokens) every
# step; 01's run is left in $(scratch)/ref
matches_01() {
    local program="$1" moe="$2" np="$3" column pp
    shift 3
    pp="$(mktemp -d "$(scratch)/pp.XXXXXX")"
    "$TRAIN01" $FLAGS $moe --overwrite --out "$(scratch)/ref" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np "$np" "$program" $FLAGS $moe "$@" --out "$pp/run" >/dev/null
    assert_losses_match "$(scratch)/ref" "$pp/run" 4
    assert_column_match grad_norm "$(scratch)/ref" "$pp/run" 4
    for column in aux_loss dropped $(head -n 1 "$(scratch)/ref/steps.csv" | tr , '\n' | grep '^tokens_e'); do
        assert_equal "$column $(csv_column "$pp/run/steps.csv" $column | tr '\n' ' ')" \
            "$column $(csv_column "$(scratch)/ref/steps.csv" $column | tr '\n' ' ')"
    done
}

@test "04 on 2 stages (1f1b) gives 01's losses and routing for 3 experts, top-2, with capacity drops" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1 --steps 4 --micro 4"
    matches_01 "$TRAIN04" "$moe" 2 --pp 2 --schedule 1f1b
    [ "$(csv_column "$(scratch)/ref/steps.csv" dropped | paste -sd+ | bc)" -gt 0 ]
}

@test "04 on 2 stages gives 01's losses and routing with gpipe, zb-h1 and interleaved (5 experts, top-1, every other block)" {
    local moe="--experts 5 --top-k 1 --capacity-factor 1.5 --aux-loss-coef 0.1 --steps 4 --micro 2 --layers 4 --moe-every 2"
    matches_01 "$TRAIN04" "$moe" 2 --pp 2 --schedule gpipe
    matches_01 "$TRAIN04" "$moe" 2 --pp 2 --schedule zb-h1
    matches_01 "$TRAIN04" "$moe" 2 --pp 2 --schedule interleaved --virtual 2
    # and with 2 replicas of the 2 stages: the routing is summed over stages and replicas
    matches_01 "$TRAIN04" "$moe" 4 --pp 2 --dp 2
}

@test "05 and 06 give 01's losses and routing with ZeRO 1-3, on stages, and with the optimizer offloaded" {
    local moe="--experts 3 --top-k 2 --capacity-factor 1 --steps 4 --micro 2"
    matches_01 "$REPO/05_zero/train" "$moe" 2 --zero 1
    matches_01 "$REPO/05_zero/train" "$moe" 2 --zero 3
    matches_01 "$REPO/05_zero/train" "$moe" 2 --zero 2 --pp 2
    matches_01 "$REPO/06_offload/train" "$moe" 2 --offload --zero 2
    matches_01 "$REPO/06_offload/train" "$moe" 2 --offload --offload-params
    matches_01 "$REPO/06_offload/train" "$moe" 2 --offload --pp 2
}

@test "03 --mp tensor --tp 2 gives 01's losses and routing: the router and experts whole on every tp rank (top-2, capacity drops; with --dp 2; and resumed both ways)" {
    # shown to fail: with the experts' tensors counted on every tp rank in the norm (replicated
    # spans marked sliced), the gradient norms were sqrt(2) too large on the MoE part
    local moe="--experts 6 --top-k 2 --capacity-factor 0.75 --steps 4"
    matches_01 "$TRAIN03" "$moe" 2 --mp tensor --tp 2
    [ "$(csv_column "$(scratch)/ref/steps.csv" dropped | paste -sd+ | bc)" -gt 0 ]
    matches_01 "$TRAIN03" "--experts 3 --top-k 1 --capacity-factor 1 --aux-loss-coef 0.1 --steps 4 --micro 2 --layers 4 --moe-every 2" \
        4 --mp tensor --tp 2 --dp 2
    local d
    d="$(scratch)"
    "$TRAIN01" $FLAGS $moe --stop-after 2 --save "$d/ck01" --out "$d/first01" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN03" $FLAGS $moe --mp tensor --tp 2 --resume "$d/ck01" --out "$d/tp" >/dev/null
    OMP_NUM_THREADS=1 mpirun_np 2 "$TRAIN03" $FLAGS $moe --mp tensor --tp 2 --stop-after 2 --save "$d/ck" --out "$d/tp1" >/dev/null
    "$TRAIN01" $FLAGS $moe --resume "$d/ck" --out "$d/single" >/dev/null
    "$TRAIN01" $FLAGS $moe --overwrite --out "$d/ref" >/dev/null
    assert_equal "$(csv_column "$d/tp/steps.csv" loss | wc -l)" 2
    run paste -d, <(csv_column "$d/ref/steps.csv" loss | tail -2) <(csv_column "$d/tp/steps.csv" loss) <(csv_column "$d/single/steps.csv" loss)
    awk -F, '{ for (i = 2; i <= 3; i++) { r = ($1 - $i) / $1; if (r < 0) r = -r; if (r > 1e-4) { print; bad = 1 } } } END { exit bad || NR != 2 }' <<<"$output"
}

@test "04 --pp 2 --tp 2 gives 01's losses and routing with 1f1b and zb-h1 (the MoE's weights in B), and with replicas; 05 and 06 with --tp 2 too" {
    local moe="--experts 4 --top-k 2 --capacity-factor 0.75 --steps 4 --batch 8 --micro 2"
    matches_01 "$TRAIN04" "$moe" 4 --pp 2 --tp 2 --schedule 1f1b
    matches_01 "$TRAIN04" "$moe" 4 --pp 2 --tp 2 --schedule zb-h1
    matches_01 "$REPO/05_zero/train" "$moe" 4 --zero 1 --tp 2 --dp 2
    matches_01 "$REPO/06_offload/train" "$moe" 4 --offload --tp 2 --dp 2
    matches_01 "$TRAIN04" "--experts 3 --top-k 1 --steps 4 --batch 8 --micro 2 --layers 4" 8 --pp 2 --tp 2 --dp 2 --schedule gpipe
}

@test "03 --mp tensor --sp, 04 --pp 2 --tp 2 --sp and 03 --sp with --ep give 01's losses and routing: every tp rank runs the experts on the gathered tokens and keeps its rows" {
    # shown to fail: with each rank keeping rank 0's rows of the experts' output (and of their input
    # gradient), the losses part from 01's at the first step
    local moe="--experts 6 --top-k 2 --capacity-factor 0.75 --steps 4"
    matches_01 "$TRAIN03" "$moe" 2 --mp tensor --tp 2 --sp
    [ "$(csv_column "$(scratch)/ref/steps.csv" dropped | paste -sd+ | bc)" -gt 0 ]
    matches_01 "$TRAIN04" "--experts 3 --top-k 1 --aux-loss-coef 0.1 --steps 4 --batch 8 --micro 2 --layers 4 --moe-every 2" \
        4 --pp 2 --tp 2 --sp --schedule 1f1b
    matches_01 "$TRAIN03" "$moe" 4 --mp tensor --tp 2 --dp 2 --ep 2 --sp
}

@test "03-06 refuse --experts with --cp above 1, in one line" {
    local cp="--experts with --cp 2 is not written yet: an expert's capacity is per whole sequence"
    assert_refusals 2 "$TRAIN03" "$FLAGS --steps 1" <<EOF
--experts 4 --cp 2|$cp
EOF
    assert_equal "$refusals_checked" 1
    assert_refusals 2 "$TRAIN04" "$FLAGS --steps 1" <<EOF
--experts 4 --cp 2|$cp
EOF
    assert_equal "$refusals_checked" 1
    assert_refusals 2 "$REPO/05_zero/train" "$FLAGS --steps 1" <<EOF
--experts 4 --cp 2|$cp
EOF
    assert_equal "$refusals_checked" 1
    assert_refusals 2 "$REPO/06_offload/train" "$FLAGS --steps 1" <<EOF
--experts 4 --offload --cp 2|$cp
EOF
    assert_equal "$refusals_checked" 1
}

@test "--help of every chapter lists the expert flags" {
    for program in "$TRAIN01" "$TRAIN02" "$TRAIN03" "$TRAIN04" "$REPO/05_zero/train" "$REPO/06_offload/train"; do
        run "$program" --help
        assert_success
        assert_line --regexp "^  --experts E  +mixture of experts"
        assert_line --regexp "^  --top-k K  +with --experts: experts per token"
        assert_line --regexp "^  --aux-loss-coef X  +with --experts"
        assert_line --regexp "^  --capacity-factor F  +with --experts"
        assert_line --regexp "^  --moe-every N  +with --experts"
    done
}
