#!/usr/bin/env bats
# Every chapter is the one before plus its technique: it runs every layout
# of the chapter before it, or refuses one only where its technique makes
# that layout unsound, in one line saying why. And its --help lists only
# what it honours. The flags are read from each chapter's --help, so that a
# flag added to a chapter is walked through the next one without a word
# here, except its sample below (a missing sample fails the walk).

load ../helpers

NP=4 # ranks of chapters 02-06; chapter 01 runs alone
FLAGS="--device cpu --layers 4 --steps 2 --batch 8 --micro 2 --sample 0 --quiet --eval-batches 1"
export OMP_NUM_THREADS=1

# Samples: for each flag a chapter's --help lists, one or more layouts of
# that chapter that use it, valid on NP ranks (chapter 01: on one), after
# FLAGS. @CK@ is a checkpoint of FLAGS' model, @NP@ the rank count.
SAMPLES='
--device          --device cpu
--model           --model tiny --layers 4
--layers          --layers 8
--dmodel          --dmodel 32
--heads           --heads 2
--seq             --seq 32
--vocab           --vocab 320
--tie-embeddings  --tie-embeddings
--tie-embeddings  --mp tensor --tie-embeddings
--device-mem-limit --device-mem-limit 1G
--recompute       --recompute
--loss-chunks     --loss-chunks 2
--loss-chunks     --mp tensor --loss-chunks 2
--batch           --batch 16
--micro           --micro 1
--steps           --steps 1
--lr              --lr 1e-3
--warmup          --warmup 1
--wd              --wd 0.01
--clip            --clip 0.5
--seed            --seed 7
--stop-after      --stop-after 1
--precision       --precision bf16
--precision       --precision fp16
--loss-scale      --precision fp16 --loss-scale 1024
--loss-scale-window --precision fp16 --loss-scale-window 100
--data            --data @CORPUS@
--out             --overwrite
--overwrite       --overwrite
--eval-every      --eval-every 1
--eval-batches    --eval-batches 2
--sample          --sample 8
--save            --save @OUT@/ck
--save-every      --save @OUT@/ck --save-every 1
--resume          --resume @CK@
--quiet           --quiet
--help            --help
--dry-run         --dry-run --world @NP@ --rank 0
--world           --dry-run --world @NP@ --rank 0
--rank            --dry-run --world @NP@ --rank 0
--comm            --comm mpi
--timeout         --timeout 120
--dp-mode         --dp-mode naive
--dp-mode         --dp-mode flat
--dp-mode         --dp-mode overlap
--dp-mode         --zero 0 --pp 2 --dp-mode naive
--dp-mode         --zero 0 --pp 2 --dp-mode overlap
--bucket-mb       --dp-mode overlap --bucket-mb 0.05
--bucket-mb       --zero 0 --pp 2 --dp-mode overlap --bucket-mb 0.05
--allreduce       --allreduce ring
--allreduce       --zero 0 --pp 2 --allreduce ring
--check-replicas  --check-replicas 1
--check-replicas  --zero 0 --pp 2 --check-replicas 1
--print-buckets   --dp-mode overlap --print-buckets
--print-buckets   --zero 0 --pp 2 --dp-mode overlap --print-buckets
--mp              --mp layer
--mp              --mp tensor
--split           --dp 2 --split 3,1
--tp              --mp tensor --tp 2 --dp 2
--dp              --dp 2
--sp              --mp tensor --sp
--cp              --cp 2
--cp              --mp tensor --tp 2 --cp 2
--cp-order        --cp 2 --cp-order contiguous
--cp-send         --cp 2 --cp-send blocking
--cp-mode         --cp 2 --cp-mode ulysses
--alltoall        --cp 2 --cp-mode ulysses --alltoall pairwise
--alltoall        --dp @NP@ --experts 4 --ep 2 --alltoall pairwise
--experts         --experts 4
--experts         --dp @NP@ --experts 4
--top-k           --experts 4 --top-k 2
--top-k           --dp @NP@ --experts 4 --top-k 2
--moe-every       --experts 4 --moe-every 2
--moe-every       --dp @NP@ --experts 4 --moe-every 2
--aux-loss-coef   --experts 4 --aux-loss-coef 0.1
--aux-loss-coef   --dp @NP@ --experts 4 --aux-loss-coef 0.1
--capacity-factor --experts 4 --capacity-factor 1
--capacity-factor --dp @NP@ --experts 4 --capacity-factor 1
--ep              --dp @NP@ --experts 4 --ep 2
--ep              --zero 0 --pp 2 --experts 4 --ep 2
--schedule        --pp 2 --schedule gpipe
--schedule        --pp 2 --schedule zb-h1
--schedule        --pp 2 --schedule interleaved --virtual 2
--virtual         --pp 2 --schedule interleaved --virtual 2
--virtual         --zero 0 --pp 2 --schedule interleaved --virtual 2
--pp              --pp 2
--pp              --pp 2 --tp 2
--print-schedule  --pp 2 --print-schedule
--zero            --zero 0
--zero            --zero 1
--zero            --zero 2
--zero            --zero 3
--prefetch        --zero 3 --prefetch 2
--offload         --offload
--dpu             --offload --dpu
--dpu-warmup      --offload --dpu --dpu-warmup 2
--dpu-reference   --offload --dpu --dpu-reference
--offload-activations --offload --recompute --offload-activations
--offload-params  --offload --offload-params
'

# Not written yet (not unsound), and each refusal says so; the flag runs in
# other layouts of the chapter (the --help check below).
NOT_YET_REFUSED="
05_zero | --pp 2 --schedule interleaved --virtual 2 | with ZeRO is not written yet
06_offload | --pp 2 --schedule interleaved --virtual 2 | with ZeRO is not written yet
$(for c in 05_zero 06_offload; do
    # ZeRO's own step on one stage (dp = the world) shards every unit evenly; --ep runs with --zero 0 on stages
    for s in "--dp @NP@ --experts 4 --ep 2" "--dp @NP@ --experts 4 --ep 2 --alltoall pairwise"; do
        echo "$c | $s | --ep 2 with ZeRO's shards (--zero 1-3, --offload) or its own step on one stage is not written yet"
    done
done)
"
# Where chapter N refuses a layout of chapter N-1, the one error line must
# name the technique's reason: CHAPTER | SAMPLE | a piece of that line.
Z="ZeRO keeps them here" # ZeRO shards the replicas' gradients: no all-reduce of whole replicas to choose
REFUSALS="$(for c in 05_zero 06_offload; do
    for s in "--dp-mode naive" "--dp-mode flat" "--dp-mode overlap" "--dp-mode overlap --bucket-mb 0.05" \
        "--dp-mode overlap --print-buckets" "--allreduce ring" "--check-replicas 1"; do
        echo "$c | $s | ${s%% *} is chapter 04's, for whole replicas; $Z"
    done
done)
$NOT_YET_REFUSED"

setup_file() {
    local d="$BATS_FILE_TMPDIR"
    cp "$REPO/course.md" "$d/corpus.txt"
    "$TRAIN01" $FLAGS --data "$d/corpus.txt" --stop-after 1 --save "$d/ck" --out "$d/ck-run" >/dev/null
}

# help_flags PROGRAM: the flags its --help lists, one a line.
help_flags() { "$1" --help | sed -n 's/^  \(--[a-z0-9-]*\).*/\1/p'; }

# samples_of FLAG KNOWN [OLD]: FLAG's samples, one a line, whose every flag
# is in KNOWN (a file of flags, one a line) and, with OLD, not every flag in OLD.
samples_of() {
    echo "$SAMPLES" | awk -v f="$1" -v known="$2" -v old="${3:-}" '
        BEGIN { while ((getline line < known) > 0) k[line] = 1
                if (old != "") while ((getline line < old) > 0) o[line] = 1 }
        $1 == f { $1 = ""; sub(/^ +/, ""); in_known = 1; in_old = old != ""
                  for (i = 1; i <= NF; i++) if ($i ~ /^--/) { if (!($i in k)) in_known = 0; if (!($i in o)) in_old = 0 }
                  if (in_known && !in_old) print }'
}

# try CHAPTER NP SAMPLE RESULT: runs the chapter's train with FLAGS and SAMPLE
# on NP ranks (a dry run or --help alone); writes its exit status to
# RESULT.status and its stderr to RESULT.stderr.
try() {
    local chapter="$1" np="$2" sample="$3" result="$4" out status
    out="$(mktemp -d "$BATS_TEST_TMPDIR/run.XXXXXX")"
    sample="${sample//@CK@/$BATS_FILE_TMPDIR/ck}"
    sample="${sample//@CORPUS@/$BATS_FILE_TMPDIR/corpus.txt}"
    sample="${sample//@OUT@/$out}"
    sample="${sample//@NP@/$np}"
    local cmd=("$REPO/$chapter/train" $FLAGS --data "$BATS_FILE_TMPDIR/corpus.txt" --out "$out/run" $sample)
    if [ "$np" = 1 ] || [[ " $sample " == *" --dry-run "* || " $sample " == *" --help "* ]]; then
        timeout 120 "${cmd[@]}" </dev/null >/dev/null 2>"$result.stderr" && status=0 || status=$?
    else
        timeout 120 bash -c "$(declare -f mpirun_np); mpirun_np $np \"\$@\"" _ "${cmd[@]}" </dev/null \
            >/dev/null 2>"$result.stderr" && status=0 || status=$?
    fi
    echo "$status" >"$result.status"
}

# try_all CHAPTER NP: runs each distinct sample of $BATS_TEST_TMPDIR/samples
# (one a line) once, RUNS at a time, into $BATS_TEST_TMPDIR/result.N for the
# sample on line N. Most of a run's time is its start-up (mpirun, MPI_Init,
# the ranks meeting), which waits more than it computes: two runs at a time
# take about two thirds of the time of one after the other, on two cores.
RUNS=2
try_all() {
    local chapter="$1" np="$2" sample n=0 running=0 first
    declare -A first_line=()
    while IFS= read -r sample; do
        n=$((n + 1))
        if [ -n "${first_line[$sample]:-}" ]; then continue; fi
        first_line[$sample]=$n
        try "$chapter" "$np" "$sample" "$BATS_TEST_TMPDIR/result.$n" &
        running=$((running + 1))
        if [ "$running" -ge "$RUNS" ]; then wait -n || true; running=$((running - 1)); fi
    done <"$BATS_TEST_TMPDIR/samples"
    wait
    n=0 # a sample met again has the result of its first run
    while IFS= read -r sample; do
        n=$((n + 1))
        first="${first_line[$sample]}"
        [ "$first" = "$n" ] || for f in status stderr; do
            cp "$BATS_TEST_TMPDIR/result.$first.$f" "$BATS_TEST_TMPDIR/result.$n.$f"; done
    done <"$BATS_TEST_TMPDIR/samples"
}

# walk CHAPTER NP KNOWN [OLD]: every sample (samples_of KNOWN OLD) of every
# flag in KNOWN, run by CHAPTER on NP ranks: it runs (status 0; the flag is
# then added to ran.CHAPTER), or it is refused (status 2, one error line)
# where REFUSALS says so, with the reason REFUSALS names. Prints every other
# outcome, and a flag without a sample, and fails after the whole walk.
walk() {
    local chapter="$1" np="$2" known="$3" old="${4:-}" flag sample expected bad=0 walked=0 flags=0 n=0
    local d="$BATS_TEST_TMPDIR"
    : >"$d/samples"
    : >"$d/sample_flags"
    while IFS= read -r flag; do
        flags=$((flags + 1))
        if ! echo "$SAMPLES" | awk -v f="$flag" '$1 == f { found = 1 } END { exit !found }'; then
            echo "$flag: no sample in inherited_layouts.bats"
            bad=1
        fi
        while IFS= read -r sample; do
            echo "$sample" >>"$d/samples"
            echo "$flag" >>"$d/sample_flags"
        done < <(samples_of "$flag" "$known" "$old")
    done <"$known"
    try_all "$chapter" "$np"
    while IFS= read -r sample && IFS= read -r flag <&4; do
        walked=$((walked + 1))
        status="$(cat "$d/result.$walked.status")"
        errors="$(grep "^error:" "$d/result.$walked.stderr" || true)"
        expected="$(echo "$REFUSALS" | awk -F' [|] ' -v c="$chapter" -v s="$sample" '$1 == c && $2 == s { print $3 }')"
        if [ -z "$expected" ] && [ "$status" = 0 ]; then
            echo "$flag" >>"$d/ran.$chapter"
            continue
        fi
        if [ -n "$expected" ] && [ "$status" = 2 ] && [ "$(echo "$errors" | grep -c .)" = 1 ] &&
            [[ "$errors" == *"$expected"* ]]; then continue; fi
        echo "$chapter $sample: status $status, expected ${expected:+refusal \"$expected\"}${expected:-a run}: $errors"
        bad=1
    done <"$d/samples" 4<"$d/sample_flags"
    rm -f "$d"/result.*
    [ "$walked" -gt 0 ] && [ "$flags" = "$(grep -c . "$known")" ] || { echo "walked $walked samples of $flags flags"; bad=1; }
    return $bad
}

# walk_chapter CHAPTER PREVIOUS: every layout of PREVIOUS (the samples of
# the flags its --help lists) through CHAPTER on NP ranks, then CHAPTER's
# own layouts; then every flag CHAPTER's --help lists must have run in at
# least one of them: --help lists only what the chapter honours.
walk_chapter() {
    local chapter="$1" previous="$2" bad=0 flag d="$BATS_TEST_TMPDIR"
    help_flags "$REPO/$previous/train" >"$d/flags.$previous"
    help_flags "$REPO/$chapter/train" >"$d/flags.$chapter"
    [ "$(grep -c . "$d/flags.$previous")" -gt 20 ] || { echo "$previous --help: too few flags read"; return 1; }
    walk "$chapter" $NP "$d/flags.$previous" || bad=1
    walk "$chapter" $NP "$d/flags.$chapter" "$d/flags.$previous" || bad=1
    while IFS= read -r flag; do
        grep -qxF -- "$flag" "$d/ran.$chapter" 2>/dev/null ||
            { echo "$chapter --help lists $flag, which no sample ran"; bad=1; }
    done <"$d/flags.$chapter"
    return $bad
}

@test "01 runs every layout its --help lists, on one rank" {
    help_flags "$TRAIN01" >"$BATS_TEST_TMPDIR/flags"
    walk 01_single_gpu 1 "$BATS_TEST_TMPDIR/flags"
}

@test "02 runs every layout of chapter 01 on $NP ranks, and every layout its --help lists" {
    walk_chapter 02_data_parallel 01_single_gpu
}

@test "03 runs every layout of chapter 02, or refuses it saying why; and every layout its --help lists" {
    walk_chapter 03_model_parallel 02_data_parallel
}

@test "04 runs every layout of chapter 03 inside its stages, or refuses it saying why; and every layout its --help lists" {
    walk_chapter 04_pipeline 03_model_parallel
}

@test "05 runs every layout of chapter 04, or refuses it saying why; and every layout its --help lists" {
    walk_chapter 05_zero 04_pipeline
}

@test "06 runs every layout of chapter 05, or refuses it saying why; and every layout its --help lists" {
    walk_chapter 06_offload 05_zero
}
