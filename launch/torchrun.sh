#!/usr/bin/env bash
# Single-node multi-process run: one process per GPU (NCCL), or N CPU workers (gloo) without GPUs.
#
#   launch/torchrun.sh [NPROC] [dfl run arguments ...]
#   launch/torchrun.sh 4 --clients 100 --model resnet18 --dataset cifar10 --topology ring
#   NPROC=8 launch/torchrun.sh configs/paper.toml --gossip-mode allgather
#
# NPROC defaults to the number of visible GPUs, or 2 CPU workers when there are none. Everything after
# NPROC is passed to `dfl run` unchanged. Each process hosts a contiguous block of clients; only rank 0
# writes the run directory and shows progress.
set -euo pipefail

if [[ $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then
    NPROC="$1"
    shift
fi
if [[ -z "${NPROC:-}" ]]; then
    GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
    NPROC=$(( GPUS > 0 ? GPUS : 2 ))
fi
if [[ "$NPROC" -lt 1 ]]; then
    echo "launch/torchrun.sh: NPROC must be >= 1, got $NPROC" >&2
    exit 2
fi
# gloo workers share the CPU: one intra-op thread each unless the caller says otherwise
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# dfl torchrun: torchrun --standalone --nnodes=1 --nproc_per_node=NPROC -m dfl.cli run ..., with the config checked
# before any rank starts and a refusal shown as dfl's one line (without torchrun's traceback)
exec python -m dfl.cli torchrun "$NPROC" "$@"
