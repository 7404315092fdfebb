#!/usr/bin/env bash
# GPT pretraining (launch/pretrain_gpt.sh) on several processes of this machine. rapidgpt starts
# them itself through MindSpore's msrun, shows rank 0's output, keeps every rank's log, and when a
# rank fails names it with the end of its traceback, stops the others and exits non-zero.
#
#   launch/single_node.sh                               # 2 processes, tensor parallel 2
#   NPROC_PER_NODE=4 TP=2 launch/single_node.sh         # tensor parallel 2 x data parallel 2
#   launch/single_node.sh --train-iters 20              # any flag after the script wins
#
# Environment:
#   NPROC_PER_NODE   processes on this machine, one per device (default: $GPUS_PER_NODE, else 2)
#   TP               --tensor-model-parallel-size (default: NPROC_PER_NODE); the data-parallel size
#                    is the number of processes / TP, and --global-batch-size (16 in pretrain_gpt.sh)
#                    must be a multiple of --micro-batch-size (8) x that
#   LOG_DIR          where every rank's log goes (default: ./rapidgpt_logs/DATE-TIME)
#   MASTER_PORT      msrun's scheduler port (default: a free one)
#   DATA_PATH, VOCAB_FILE, MERGE_FILE, ...   as for launch/pretrain_gpt.sh (default: demo corpus)
set -euo pipefail

NPROC_PER_NODE="${NPROC_PER_NODE:-${GPUS_PER_NODE:-2}}"
DISTRIBUTED_ARGS=(--nproc-per-node "$NPROC_PER_NODE")
if [[ -n "${LOG_DIR:-}" ]]; then
    DISTRIBUTED_ARGS+=(--log-dir "$LOG_DIR")
fi
PARALLEL_ARGS=(--tensor-model-parallel-size "${TP:-$NPROC_PER_NODE}")

exec "$(dirname "${BASH_SOURCE[0]}")/pretrain_gpt.sh" "${DISTRIBUTED_ARGS[@]}" "${PARALLEL_ARGS[@]}" "$@"
