#!/usr/bin/env bash
# Multi-node example for SLURM: one torchrun per node, one process per GPU, NCCL between all of them.
# Adapt the #SBATCH lines to your cluster, then:
#
#   sbatch launch/slurm_multinode.sh --clients 400 --model resnet18 --dataset cifar10 --topology ring
#
# Ranks are numbered node by node (node 0 hosts ranks 0..G-1, ...), and clients are split over ranks in
# contiguous blocks, so neighbouring clients of a ring mostly live on the same node.
#SBATCH --job-name=dfl
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=04:00:00
set -euo pipefail

GPUS_PER_NODE="${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-4}}"
# rendezvous on the first node of the allocation
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT="${MASTER_PORT:-29500}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"
# If NCCL picks the wrong network interface, name it: export NCCL_SOCKET_IFNAME=ib0 (or eth0)

srun --ntasks-per-node=1 torchrun \
    --nnodes="$SLURM_JOB_NUM_NODES" \
    --nproc_per_node="$GPUS_PER_NODE" \
    --rdzv_id="$SLURM_JOB_ID" \
    --rdzv_backend=c10d \
    --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \
    -m dfl.cli run "$@"
