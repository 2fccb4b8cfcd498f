#!/usr/bin/env bash
# Runs a Horovod worker on one core of its own: core (local rank mod the cores this process may use). Two workers on
# a 2-core machine otherwise time-share both cores with each other's TensorFlow and Horovod threads; pinned, the same
# bench runs 1.1-1.3x faster (README, "Table backends and pinning"). Use: horovodrun ... scripts/pin_worker.sh CMD...
set -euo pipefail
cores=($(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))'))
# The local rank as horovodrun --gloo sets it, or as Open MPI's mpirun does (horovodrun --mpi).
rank=${HOROVOD_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${HOROVOD_RANK:-0}}}
exec taskset -c "${cores[$((rank % ${#cores[@]}))]}" "$@"
