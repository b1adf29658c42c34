#!/usr/bin/env bats
# Chapter 06's host AdamW (06_offload/cpu_adam.c): every SIMD path this CPU
# runs equals the kernel table's AdamW bit for bit, the path is chosen from
# the CPU and can be forced, and its benchmarks (adambench, and the PyTorch
# comparison where PyTorch exists) report what they promise.

load ../helpers

TEST="$BUILD/tests/test_cpu_adam"
BENCH="$REPO/06_offload/adambench"

# The paths this CPU runs, e.g. "scalar avx2".
supported_paths() { "$TEST" path | sed -n 's/^supported //p'; }

@test "every path this CPU runs equals the kernel table's AdamW bit for bit, with and without the 16-bit write-back" {
    run "$TEST" parity
    assert_success
    for path in $(supported_paths); do
        assert_output --partial "PASS $path path equals the kernel table bit for bit"
    done
    refute_output --partial FAIL
}

@test "the vector paths contain no fused multiply-add, which would change the last bit" {
    command -v objdump >/dev/null || skip "objdump not found"
    run bash -c "objdump -d '$BUILD/06_offload/cpu_adam.o' | grep -cE 'vf(n?)m(add|sub)'"
    assert_output "0"
}

@test "cpu_adamw takes the widest path the CPU runs; COURSE_CPU_ADAM forces one and refuses the impossible" {
    widest=$(supported_paths | awk '{ print $NF }')
    run "$TEST" path
    assert_output --partial "path $widest"
    COURSE_CPU_ADAM=scalar run "$TEST" path
    assert_output --partial "path scalar"
    COURSE_CPU_ADAM=auto run "$TEST" path
    assert_output --partial "path $widest"
    COURSE_CPU_ADAM=sse9 run --separate-stderr "$TEST" path
    assert_equal "$status" 2
    assert_equal "$stderr" "error: COURSE_CPU_ADAM=sse9: unknown path (expected auto, scalar, avx2 or avx512)"
    for path in avx2 avx512; do
        [[ " $(supported_paths) " == *" $path "* ]] && continue
        COURSE_CPU_ADAM=$path run --separate-stderr "$TEST" path
        assert_equal "$status" 2
        [[ "$stderr" == "error: COURSE_CPU_ADAM=$path: this CPU cannot run it (it supports: scalar"* ]]
    done
}

@test "adambench times the copy, the reference and every path, in a table and a CSV" {
    d="$BATS_TEST_TMPDIR/bench"
    run "$BENCH" --n 64K --reps 2 --threads 2 --out "$d"
    assert_success
    assert_output --partial "adambench: 65536 parameters (1 MiB of fp32 state), 2 threads, median of 2 updates"
    assert_output --regexp "kernel +path +half +ms +Gparam/s +GB/s +copy GB/s +% of copy +x scalar"
    assert_equal "$(head -1 "$d/adambench.csv")" \
        "kernel,path,half,threads,n,reps,clock,bytes_per_param,median_ms,params_per_s,GBps,copy_GBps,pct_of_copy,x_scalar,cpu"
    want="copy,memcpy,none reference,scalar,none"
    for path in $(supported_paths); do want="$want $path,none $path,bf16 $path,fp16"; done
    got=$(tail -n +2 "$d/adambench.csv" | cut -d, -f1-3 | sed 's/^cpu_adamw,//' | tr '\n' ' ')
    assert_equal "$got" "$want "
    # the numbers hang together: GBps = params/s x bytes / 1e9, pct = GBps / copy, scalar rows x1
    run awk -F, 'NR > 1 {
        if ($9 <= 0 || $10 <= 0 || $12 <= 0) { print "not positive: " $0; bad = 1 }
        if ($8 != ($1 == "copy" ? 32 : $3 == "none" ? 28 : 30)) { print "bytes: " $0; bad = 1 }
        g = $10 * $8 / 1e9; if ((g - $11) / $11 > 1e-3 || ($11 - g) / $11 > 1e-3) { print "GBps: " $0; bad = 1 }
        p = 100 * $11 / $12; if (p - $13 > 0.1 || $13 - p > 0.1) { print "pct: " $0; bad = 1 }
        if ($1 == "cpu_adamw" && $2 == "scalar" && $14 != "1.00") { print "x_scalar: " $0; bad = 1 }
        if ($4 != 2 || $5 != 65536 || $6 != 2 || $7 != "wall") { print "settings: " $0; bad = 1 } } END { exit bad }' "$d/adambench.csv"
    assert_success
    # one path, one write-back, timed in CPU time
    run "$BENCH" --n 4K --reps 1 --path scalar --half bf16 --clock cpu
    assert_success
    assert_equal "$(echo "$output" | grep -c '^cpu_adamw')" 1
    assert_output --regexp "cpu_adamw scalar +bf16"
    assert_output --partial "median of 1 updates, CPU time"
}

@test "adambench refuses bad input with one line and exit status 2, and explains itself with --help" {
    for args in "--n 10" "--n 2G" "--n lots" "--threads 0" "--reps 0" "--path sse" "--half fp8" "--clock tsc" "--bogus" \
        "--n" "stray"; do
        run --separate-stderr "$BENCH" $args
        assert_equal "$status" 2
        assert_equal "$(echo "$stderr" | wc -l)" 1
        [[ "$stderr" == error:* ]]
    done
    run --separate-stderr "$BENCH" --threads 0
    assert_equal "$stderr" "error: --threads: 0 is out of range (valid: 1..1024)"
    run "$BENCH" --help
    assert_success
    for flag in --n --threads --reps --path --half --clock --out; do assert_output --partial "  $flag "; done
}

@test "adambench refuses an --n this machine cannot hold at once, naming the need and what is available" {
    local available_kib
    available_kib=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    [ "$available_kib" -lt $((50 * 1024 * 1024)) ] || skip "this machine has 50 GiB available: --n 1G fits"
    SECONDS=0
    run --separate-stderr "$BENCH" --n 1G --out "$(scratch)/b"
    assert_equal "$status" 2
    assert_output ""
    [[ "$stderr" =~ ^"error: --n 1G needs 50.0 GiB of host memory (50 bytes per parameter: 18 of state, 32 for the copy's source and target) but "[0-9.]+" GiB is available (MemAvailable); valid here: --n up to "[0-9]+M$ ]]
    [ "$SECONDS" -le 2 ]
    [ ! -e "$(scratch)/b" ]
}

# A stand-in for PyTorch with just what adambench_torch.py calls: lists of
# floats and an AdamW that refuses fused=True, as PyTorch before 2.4 does.
fake_torch() {
    mkdir -p "$1/torch"
    cat >"$1/torch/__init__.py" <<'EOF'
import random
__version__ = "0.0-fake"
float32 = "float32"
_threads = [3]
def set_num_threads(n): _threads[0] = n
def get_num_threads(): return _threads[0]
class Generator:
    def manual_seed(self, s): self.r = random.Random(s); return self
class Tensor:
    def __init__(self, data): self.data = list(data); self.shape = (len(self.data),); self.grad = None
    def uniform_(self, generator): self.data = [generator.r.random() for _ in self.data]; return self
    def copy_(self, other): self.data[:] = other.data; return self
    def __sub__(self, x): return Tensor(d - x for d in self.data)
    def __mul__(self, x): return Tensor(d * x for d in self.data)
def empty(n, dtype=None): return Tensor([0.0] * n)
def empty_like(t): return Tensor([0.0] * len(t.data))
def rand(shape, generator): n = shape if isinstance(shape, int) else shape[0]; return Tensor(generator.r.random() for _ in range(n))
class nn:
    @staticmethod
    def Parameter(t): return t
class optim:
    class AdamW:
        def __init__(self, params, lr, betas, eps, weight_decay, foreach=None, fused=None):
            if fused: raise RuntimeError("fused=True requires CUDA")
            self.params = params
        def step(self):
            for p in self.params: p.data = [d - 1e-3 * g for d, g in zip(p.data, p.grad.data)]
EOF
}

@test "the PyTorch comparison skips without PyTorch, and with it writes adambench's columns and the ratio" {
    d="$BATS_TEST_TMPDIR/torch"
    if python3 -c "import torch" 2>/dev/null; then
        run python3 "$REPO/06_offload/adambench_torch.py" --n 64K --reps 2 --threads 2 --out "$d/real"
        assert_success
        assert_equal "$(csv_column "$d/real/adambench_torch.csv" path | tr '\n' ' ')" "single-tensor foreach fused "
    else
        run python3 "$REPO/06_offload/adambench_torch.py" --n 64K --out "$d/none"
        assert_success
        assert_output "adambench_torch.py: PyTorch is not importable here; skipped (nothing written)"
        [ ! -e "$d/none" ]
    fi
    # the script's own logic, on a stand-in: modes, columns, the ratio to adambench's best fp32 path
    fake_torch "$d/fake"
    "$BENCH" --n 1K --reps 1 --threads 2 --half none --out "$d/out" >/dev/null
    PYTHONPATH="$d/fake" run python3 "$REPO/06_offload/adambench_torch.py" --n 1K --reps 2 --threads 2 --out "$d/out"
    assert_success
    assert_output --partial "fused AdamW unavailable in PyTorch 0.0-fake"
    assert_equal "$(head -1 "$d/out/adambench_torch.csv")" \
        "$(head -1 "$d/out/adambench.csv"),cpu_adamw_x"
    assert_equal "$(csv_column "$d/out/adambench_torch.csv" path | tr '\n' ' ')" "single-tensor foreach "
    ours=$(awk -F, '$1 == "cpu_adamw" && $3 == "none" && $10 > best { best = $10 } END { print best }' "$d/out/adambench.csv")
    run awk -F, -v ours="$ours" 'NR > 1 { r = ours / $10; if ((r - $16) / r > 0.01 || ($16 - r) / r > 0.01 || $4 != 2) bad = 1 }
                                 END { exit bad }' "$d/out/adambench_torch.csv"
    assert_success
    run --separate-stderr python3 "$REPO/06_offload/adambench_torch.py" --threads 0
    assert_equal "$status" 2
    assert_equal "$stderr" "error: adambench_torch.py: argument --threads: '0' is not an integer from 1 to 1024 (see --help)"
}
