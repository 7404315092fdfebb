#!/usr/bin/env bash
# Rapidformer's full switch set at once, on 8 processes of this machine: tensor parallel 2 x
# pipeline parallel 2 x data parallel 2, ZeRO stage 2 over each stage's data-parallel pair, full
# activation recompute and fp16 mixed precision, training user_scripts/pretrain_gpt.py (through
# launch/pretrain_gpt.sh) on a tiny GPT so that 8 ranks fit on a 2-core machine (~2 min).
#
#   launch/rapidformer_switches.sh
#   launch/rapidformer_switches.sh --num-layers 8 --hidden-size 512 --train-iters 200   # later flags win
#
# Environment: LOG_DIR, MASTER_PORT, DATA_PATH, VOCAB_FILE, MERGE_FILE, ... as for launch/single_node.sh.
# The loss scale starts at 2^16 and doubles after every 3 iterations without overflow (fp16's
# default start, 2^32, would skip about the first 16 iterations of this short run).
set -euo pipefail

RAPIDFORMER_SWITCHES=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2
    --zero-2-memory-optimization
    --checkpoint-activations
    --mixed-precision
)
TINY_MODEL=(
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256
    --seq-length 64 --max-position-embeddings 64
    --micro-batch-size 2 --global-batch-size 8 --train-iters 30
    --log-interval 5 --eval-interval 15 --eval-iters 2
    --initial-loss-scale 65536 --loss-scale-window 3
)

NPROC_PER_NODE=8 TP=2 exec "$(dirname "${BASH_SOURCE[0]}")/single_node.sh" \
    "${RAPIDFORMER_SWITCHES[@]}" "${TINY_MODEL[@]}" "$@"
