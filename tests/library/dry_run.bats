#!/usr/bin/env bats
# The dry run (--dry-run --world N --rank R, harness.h): one rank's start-up
# and step with the chapter's own code, on a device that allocates address
# space only and computes nothing, and a transport that counts bytes and sends
# nothing. For each layout below the real job runs once (setup_file), then
# every rank's dry run must give the real memory.csv's rows of that rank, line
# for line, and its share of run.csv's bytes per axis: summed over the ranks,
# the real run's bytes_{dp,pp,cp,tp,ep}_per_step.

load ../helpers

FLAGS="--device cpu --model tiny --steps 1 --eval-batches 1 --sample 0 --quiet"

# NAME RANKS PROGRAM FLAGS...: the layouts (a tiny model, one step)
LAYOUTS="01 1 01_single_gpu
02-flat 2 02_data_parallel --dp-mode flat
02-overlap 2 02_data_parallel --dp-mode overlap
02-ring 2 02_data_parallel --allreduce ring
02-odd 3 02_data_parallel --dmodel 48 --heads 3 --batch 6
03-layer 2 03_model_parallel --mp layer
03-tensor 2 03_model_parallel --mp tensor
03-cp 2 03_model_parallel --cp 2
03-sp 2 03_model_parallel --mp tensor --sp
03-ep 2 03_model_parallel --experts 4 --top-k 2 --capacity-factor 1 --dp 2 --ep 2
04-1f1b 2 04_pipeline --pp 2 --schedule 1f1b --batch 4 --micro 2
04-zb-h1 2 04_pipeline --pp 2 --schedule zb-h1 --batch 4 --micro 2
04-interleaved 2 04_pipeline --pp 2 --schedule interleaved --virtual 2 --layers 4 --batch 4 --micro 2
04-3d 8 04_pipeline --pp 2 --tp 2 --dp 2 --layers 4 --batch 8 --micro 2
04-cp 4 04_pipeline --pp 2 --cp 2 --layers 4 --batch 4 --micro 2
04-sp 4 04_pipeline --pp 2 --tp 2 --sp --layers 4 --batch 4 --micro 2
04-overlap 4 04_pipeline --pp 2 --dp-mode overlap --bucket-mb 0.02 --layers 4 --batch 4 --micro 2
05-zero1 2 05_zero --zero 1
05-zero2 2 05_zero --zero 2
05-zero3 2 05_zero --zero 3
05-zero1-pp 4 05_zero --zero 1 --pp 2 --batch 4 --micro 2
05-zero2-bf16 3 05_zero --zero 2 --precision bf16 --batch 6
05-zero1-cp 4 05_zero --zero 1 --cp 2 --batch 4
06-offload 2 06_offload --offload
06-offload-pp 4 06_offload --offload --pp 2 --batch 4 --micro 2"

layout() { grep "^$1 " <<<"$LAYOUTS"; }

setup_file() {
    local name np program flags
    while read -r name np program flags; do
        if [ "$np" = 1 ]; then
            "$REPO/$program/train" $FLAGS $flags --out "$BATS_FILE_TMPDIR/$name/real" </dev/null >/dev/null
        else # (mpirun reads stdin: the layouts)
            mpirun_np "$np" "$REPO/$program/train" $FLAGS $flags --out "$BATS_FILE_TMPDIR/$name/real" \
                </dev/null >/dev/null
        fi
    done <<<"$LAYOUTS"
}

# assert_dry_runs_match NAME: every rank's dry run of layout NAME against its real run
assert_dry_runs_match() {
    local name np program flags dir r
    read -r name np program flags <<<"$(layout "$1")"
    dir="$BATS_FILE_TMPDIR/$name"
    [ -s "$dir/real/memory.csv" ]
    head -n 1 "$dir/real/memory.csv" >"$dir/dry-memory.csv"
    for ((r = 0; r < np; r++)); do
        run "$REPO/$program/train" $FLAGS $flags --dry-run --world "$np" --rank "$r" --out "$dir/dry$r"
        assert_success
        tail -n +2 "$dir/dry$r/memory.csv" >>"$dir/dry-memory.csv"
    done
    run diff "$dir/real/memory.csv" "$dir/dry-memory.csv"
    assert_success
    [ "$(wc -l <"$dir/dry-memory.csv")" -gt "$np" ]
    [ "$np" = 1 ] && return # one process: no bytes columns
    local axis real dry
    for axis in dp pp cp tp ep; do
        real="$(csv_column "$dir/real/run.csv" "bytes_${axis}_per_step")"
        [ -n "$real" ]
        dry=0
        for ((r = 0; r < np; r++)); do
            dry=$((dry + $(csv_column "$dir/dry$r/run.csv" "bytes_${axis}_per_step")))
        done
        assert_equal "$axis $dry" "$axis $real"
    done
}

@test "dry run of 01 gives the real run's memory.csv" { assert_dry_runs_match 01; }
@test "dry runs of 02's flat data parallelism on 2 ranks give its memory and bytes" { assert_dry_runs_match 02-flat; }
@test "dry runs of 02's overlapped buckets on 2 ranks give its memory and bytes" { assert_dry_runs_match 02-overlap; }
@test "dry runs of 02's ring all-reduce on 2 ranks give its memory and bytes" { assert_dry_runs_match 02-ring; }
@test "dry runs of 02 on 3 ranks with dmodel 48 give its memory and bytes" { assert_dry_runs_match 02-odd; }
@test "dry runs of 03's layer split give its memory and bytes" { assert_dry_runs_match 03-layer; }
@test "dry runs of 03's tensor parallelism give its memory and bytes" { assert_dry_runs_match 03-tensor; }
@test "dry runs of 03's context parallelism give its memory and bytes" { assert_dry_runs_match 03-cp; }
@test "dry runs of 03's sequence parallelism give its memory and bytes" { assert_dry_runs_match 03-sp; }
@test "dry runs of 03's expert parallelism give its memory and bytes" { assert_dry_runs_match 03-ep; }
@test "dry runs of 04's 1F1B on 2 stages give its memory and bytes" { assert_dry_runs_match 04-1f1b; }
@test "dry runs of 04's ZB-H1 give its memory and bytes" { assert_dry_runs_match 04-zb-h1; }
@test "dry runs of 04's interleaved schedule give its memory and bytes" { assert_dry_runs_match 04-interleaved; }
@test "dry runs of 04's pp 2 x tp 2 x dp 2 on 8 ranks give its memory and bytes" { assert_dry_runs_match 04-3d; }
@test "dry runs of 04's context parallelism inside 2 stages give its memory and bytes" { assert_dry_runs_match 04-cp; }
@test "dry runs of 04's sequence parallelism inside 2 stages give its memory and bytes" { assert_dry_runs_match 04-sp; }
@test "dry runs of 04's overlapped buckets across 2 replicas of 2 stages give its memory and bytes" { assert_dry_runs_match 04-overlap; }
@test "dry runs of 05's ZeRO-1 give its memory and bytes" { assert_dry_runs_match 05-zero1; }
@test "dry runs of 05's ZeRO-2 give its memory and bytes" { assert_dry_runs_match 05-zero2; }
@test "dry runs of 05's ZeRO-3 give its memory and bytes" { assert_dry_runs_match 05-zero3; }
@test "dry runs of 05's ZeRO-1 with 2 pipeline stages give its memory and bytes" { assert_dry_runs_match 05-zero1-pp; }
@test "dry runs of 05's ZeRO-2 in bf16 on 3 ranks give its memory and bytes" { assert_dry_runs_match 05-zero2-bf16; }
@test "dry runs of 05's ZeRO-1 over dp 2 x cp 2 give its memory and bytes" { assert_dry_runs_match 05-zero1-cp; }
@test "dry runs of 06's offload on 2 ranks give its memory and bytes" { assert_dry_runs_match 06-offload; }
@test "dry runs of 06's offload with 2 pipeline stages give its memory and bytes" { assert_dry_runs_match 06-offload-pp; }

@test "a gpt2-sized dry run finishes in seconds, its host memory that of the program alone" {
    local dir
    dir="$(scratch)"
    # the program's own resident size (its libraries: OpenBLAS, MPI, CUDA's) with nothing allocated
    /usr/bin/time -f %M -o "$dir/help.kb" "$REPO/05_zero/train" --help >/dev/null
    run timeout 30 /usr/bin/time -f %M -o "$dir/dry.kb" "$REPO/05_zero/train" --model gpt2 --batch 8 --steps 1 \
        --zero 1 --dry-run --world 8 --rank 3 --quiet --out "$dir/gpt2"
    assert_success
    # it planned a gpt2 replica's weights, gradients and state (over 1 GiB on its device) ...
    local peak
    peak="$(csv_column "$dir/gpt2/run.csv" peak_device_bytes)"
    [ "$peak" -gt $((1 << 30)) ]
    # ... in at most 64 MiB of host memory more than the program needs to print --help
    local extra_kb=$(($(tail -n 1 "$dir/dry.kb") - $(tail -n 1 "$dir/help.kb")))
    echo "peak device bytes $peak, extra resident KiB $extra_kb"
    [ "$extra_kb" -lt $((64 * 1024)) ]
}

@test "a dry run of rank 777 of 1024 ranks (pp 4 x tp 4 x dp 64) runs where MPI cannot start" {
    local dir
    dir="$(scratch)"
    # a bogus point-to-point layer makes MPI_Init fail: the dry run never calls it
    run env OMPI_MCA_pml=no_such_pml timeout 60 "$REPO/04_pipeline/train" --model gpt2 --dmodel 1024 --heads 16 \
        --pp 4 --tp 4 --dp 64 --batch 256 --micro 4 --steps 1 --dry-run --world 1024 --rank 777 --quiet \
        --out "$dir/big"
    assert_success
    # rank 777's rows only, and bytes on the three axes it has (none on cp)
    run cut -d, -f1 "$dir/big/memory.csv"
    assert_equal "$(sort -u <<<"${output#rank$'\n'}")" 777
    assert_equal "$(csv_column "$dir/big/run.csv" world_size)" 1024
    [ "$(csv_column "$dir/big/run.csv" bytes_dp_per_step)" -gt 0 ]
    [ "$(csv_column "$dir/big/run.csv" bytes_pp_per_step)" -gt 0 ]
    [ "$(csv_column "$dir/big/run.csv" bytes_tp_per_step)" -gt 0 ]
    assert_equal "$(csv_column "$dir/big/run.csv" bytes_cp_per_step)" 0
}

@test "a dry run of a rank other than 0 leaves complete files only: its own timeline, no part file" {
    local dir
    dir="$(scratch)"
    # the chapters that time their actions: 03's ring, 04's and 06's stages, 05's ZeRO
    for layout in "03_model_parallel --cp 2" "04_pipeline --pp 2" "05_zero --zero 3" "06_offload --offload --pp 2"; do
        local program=${layout%% *} flags=${layout#* }
        run "$REPO/$program/train" $FLAGS $flags --dry-run --world 2 --rank 1 --out "$dir/$program"
        assert_success
        # no part file left behind (timeline.csv.tmp: the other ranks' turns never come)
        run find "$dir/$program" -name '*.tmp'
        assert_output ""
        # the timeline is this rank's: a header, then its rows, each of rank 1
        assert_equal "$(head -n 1 "$dir/$program/timeline.csv")" "rank,step,micro,op,start_us,end_us"
        run cut -d, -f1 "$dir/$program/timeline.csv"
        assert_equal "$(tail -n +2 <<<"$output" | sort -u)" 1
        [ -s "$dir/$program/trace.json" ]
    done
}

@test "bad dry-run input gets one line and exit 2" {
    local train="$REPO/02_data_parallel/train" out
    out="$(scratch)/bad"
    run --separate-stderr "$train" --dry-run --world 4 --rank 4 --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --rank 4 is not a rank of --world 4 (valid: 0..3)"
    run --separate-stderr "$train" --world 4 --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --world applies to --dry-run only (a job's ranks are mpirun -np N)"
    run --separate-stderr "$train" --rank 1 --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --rank applies to --dry-run only (a job's ranks are mpirun -np N)"
    run --separate-stderr "$TRAIN01" --dry-run --world 2 --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --world 2: this program runs on one process (valid: 1)"
    run --separate-stderr "$train" --dry-run --world 0 --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --world: 0 is out of range (valid: 1..1048576)"
    run --separate-stderr "$train" --dry-run --save "$out.ckpt" --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --dry-run writes and reads no checkpoint (valid: without --save)"
    run --separate-stderr "$train" --dry-run --device cuda --out "$out"
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --dry-run plans the CPU backend's buffers (valid: --device auto or cpu)"
    # a trainer's flag: the planner drives the dry runs, and does not take it
    run --separate-stderr "$REPO/common/plan" --model tiny --dry-run
    assert_equal "$status" 2
    assert_equal "$stderr" "error: --dry-run: the planner runs the dry runs itself, one per distinct rank (valid: the run's flags, with --dp and --pp for its ranks)"
    run mpirun_np 2 "$train" --dry-run --world 2 --out "$out"
    assert_failure
    assert_output --partial "--dry-run runs one rank as one process, not under mpirun (this job has 2 processes"
    [ ! -e "$out" ] # nothing written by any of them
}
