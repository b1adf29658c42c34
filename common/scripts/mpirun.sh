#!/bin/bash
# common/scripts/mpirun.sh -np N PROGRAM [ARGS...]: mpirun for the course's multi-rank commands on one
# machine, any machine: a laptop, a 2-core virtual machine, a container where you are root.
#
# It runs `mpirun -np N PROGRAM ARGS...` and adds only what such machines need:
#   --oversubscribe        more ranks than cores is allowed (Open MPI refuses it otherwise): on
#                          the CPU backend a rank plays a GPU, and a course run may have 4 of them
#                          on 2 cores
#   OMPI_ALLOW_RUN_AS_ROOT only when you are root (containers), which Open MPI refuses otherwise
#   OMP_NUM_THREADS        when you have not set it: the cores divided by the ranks, at least 1.
#                          Every rank is a process with its own OpenMP threads; with the default
#                          (one thread per core in every rank) 4 ranks on 2 cores run 8 threads
#                          that take turns, and a run of seconds takes minutes
#   OMP_WAIT_POLICY        passive when you have not set it: an idle OpenMP thread sleeps instead
#                          of spinning on a core another rank needs
#   OMPI_MCA_mtl           ^ofi,psm,psm2 when you have not set it: every rank would otherwise open
#                          the Omni-Path and InfiniPath drivers (PSM, PSM2), find no such adapter
#                          and close them, a quarter of a second a rank; on one machine the ranks
#                          talk through shared memory either way
#   Open MPI's notices     left out of stderr when a rank fails (its banners between lines of dashes
#                          and its "[host:pid]" lines): the course's programs end the job with one
#                          line naming the rank and the cause, and the exit status is the failing
#                          rank's (2 for a refused flag). A rank killed by a signal, which can say
#                          nothing, gets one line from this script instead, naming the rank that
#                          Open MPI's notice named ("rank 1 of PROGRAM was killed by signal 9")
# The OpenMP variables are passed on to the ranks (-x). (Open MPI's mpi_yield_when_idle, which lets a
# waiting rank give its core away, the programs set themselves: common/comm/comm.h, "Cores".) Set them yourself to override, e.g.
#   OMP_NUM_THREADS=2 common/scripts/mpirun.sh -np 2 ./02_data_parallel/train
# With MPICH or another MPI than Open MPI, the flags Open MPI needs are left out. Across machines
# (a hostfile, Slurm) use mpirun or srun directly, as chapter 04's "Beyond one machine" shows:
# the cores of this machine say nothing about the others'.
set -euo pipefail

if [ "${1:-}" != "-np" ] || ! [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || [ $# -lt 3 ]; then
    echo "usage: common/scripts/mpirun.sh -np N PROGRAM [ARGS...]" >&2
    exit 2
fi
ranks="$2"
shift 2

# GNU nproc obeys OMP_NUM_THREADS and OMP_THREAD_LIMIT; the cores are what it says without them.
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
threads=$((cores / ranks))
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((threads > 0 ? threads : 1))}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

# open_mpi_notices PROGRAM: stderr with Open MPI's notices left out (above); the notice that a rank
# died of a signal becomes one line naming it, and the status is then 3. It ignores Ctrl-C and kill,
# which mpirun passes on to the ranks: it reads their last words until mpirun ends.
open_mpi_notices() {
    trap '' INT TERM
    awk -v program="$1" '
        /^--------------------+$/ { in_notice = !in_notice; next }
        in_notice && match($0, /process rank [0-9]+ with PID [0-9]+ on node .* exited on signal [0-9]+/) {
            n = split(substr($0, RSTART, RLENGTH), w, " ")
            why = substr($0, RSTART + RLENGTH) # " (Killed)."
            sub(/^ */, "", why)
            sub(/\.$/, "", why)
            printf "common/scripts/mpirun.sh: rank %s of %s was killed by signal %s %s\n", w[3], program, w[n], why
            fflush()
            named = 1
        }
        in_notice || /^\[[^] ]+:[0-9]+\] / { next }
        { print; fflush() }
        END { exit named ? 3 : 0 }'
}

flags=()
status=0
named=0
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then
    flags+=(--oversubscribe -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
    export OMPI_MCA_mtl="${OMPI_MCA_mtl:-^ofi,psm,psm2}"
    if [ "$(id -u)" = 0 ]; then
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    fi
    # stdout as it is (fd 3); stderr through the filter
    exec 3>&1
    set +e
    mpirun "${flags[@]}" -np "$ranks" "$@" 2>&1 1>&3 3>&- | open_mpi_notices "$1" 3>&- >&2
    statuses=("${PIPESTATUS[@]}")
    set -e
    exec 3>&-
    status="${statuses[0]}"
    [ "${statuses[1]}" != 3 ] || named=1
else
    mpirun -np "$ranks" "$@" || status=$?
fi
if ((status > 128 && !named)); then
    echo "common/scripts/mpirun.sh: a rank of $1 was killed by signal $((status - 128)) ($(kill -l $((status - 128)) 2>/dev/null || echo '?'))" >&2
fi
exit "$status"
