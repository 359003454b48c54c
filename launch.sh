#!/usr/bin/env bash
# One TBA job: ranks 0..T-1 train (T = n_trainers, 1 by default), the rest search.   bash launch.sh [CONFIG] [k=v ...]
# Without a CONFIG it runs the embedded default, configs/tiny.yaml (a tiny model that learns on CPU in minutes).
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT and NPROC_PER_NODE (Slurm: scripts/slurm.sbatch).
# --help: every config key.
# Memory plan for GPUs you do not have yet: python train.py --plan CONFIG [key=value ...] --gpus N --gpu-memory-gb M
set -euo pipefail
cd "$(dirname "$0")"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
case "${1:-}" in -h|--help) exec "$PY" train.py --help ;; ""|*=*) set -- configs/tiny.yaml "$@" ;; esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
# torchrun's grace from SIGTERM to SIGKILL for the ranks (its default, 30 s, rarely fits a 7B step and a save); the
# scheduler's own grace (Slurm KillWait, Kubernetes terminationGracePeriodSeconds) must be at least as long
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-300}"
PREPARED=$("$PY" train.py --prepare "$@") || exit 2   # config, data, model, GPU memory: one line on error
read -r NPROC RESTARTS <<< "${PREPARED##*$'\n'}"     # ranks, and max_restarts when it is not 0
# One node without MASTER_PORT: torchrun's store listens on a port the OS picks and holds (no --master_port given:
# c10d rendezvous on localhost:0), so jobs run side by side without racing for a port. Otherwise the given address.
RDZV=(--local_addr=127.0.0.1)
if [ "${NNODES:-1}" != 1 ] || [ -n "${MASTER_PORT:-}" ]; then
  RDZV=(--master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-29500}")
fi
# torchrun, translated: SIGTERM / SIGINT (scancel, pre-emption, Ctrl-C) end the job with 128 + the signal, i.e.
# stopped and resumable with resume=auto, and a failed rank ends it with that rank's exit code (the trainer's when it
# has one); either way without torchrun's traceback and log lines: the trainer has already said why in one line.
exec "$PY" -c '
import logging, os, sys
os.environ.setdefault("LOGLEVEL", "CRITICAL")  # torchrun logs what the trainer says in its own line: "closing
logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # signal", "failed (exitcode: -9)", ...
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run
try:
    run(parse_args(sys.argv[1:]))
except ChildFailedError as e:
    failure = e.failures.get(0) or e.get_first_failure()[1]
    sys.exit(failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode)
# the signal, also where torch lost it: one that lands as a metrics.prof wrapper enters its try, before its timer
# starts, comes out as the UnboundLocalError of that wrapper (torch 2.13; the agent sends the ranks SIGTERM then)
except Exception as e:
    cause = e
    while cause is not None and not isinstance(cause, SignalException):
        cause = cause.__context__
    if cause is None:
        raise
    sys.exit(128 + int(cause.sigval))
' --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" "${RDZV[@]}" \
  --nproc_per_node="${NPROC_PER_NODE:-$NPROC}" --max-restarts="${RESTARTS:-0}" \
  train.py "$@"
