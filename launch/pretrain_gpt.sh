#!/usr/bin/env bash
# Megatron-style GPT pretraining with the example trainer user_scripts/pretrain_gpt.py.
#
#   launch/pretrain_gpt.sh                          # demo corpus, small GPT (4 x 256), 100 iterations, ~2 min on 2 CPU cores
#   DATA_PATH=my-corpus_text_document VOCAB_FILE=vocab.json MERGE_FILE=merges.txt launch/pretrain_gpt.sh
#   launch/pretrain_gpt.sh --train-iters 20 --num-layers 2     # any flag after the script wins
#
# Environment:
#   DATA_PATH        Megatron .bin/.idx prefix, or "W1 PREFIX1 W2 PREFIX2" to blend (default: demo corpus)
#   VOCAB_FILE, MERGE_FILE   the GPT-2 BPE files the data was preprocessed with (default: demo corpus's)
#   TENSORBOARD_DIR  write TensorBoard scalars there (default: none)
#   RAPIDGPT, PYTHON see launch/common.sh
#
# Switches (Megatron names) this build accepts: model size (--num-layers --hidden-size
# --num-attention-heads --ffn-hidden-size --seq-length --max-position-embeddings), batch
# (--micro-batch-size, --global-batch-size: a multiple accumulates gradients), optimizer (--lr
# --min-lr --lr-decay-style --lr-warmup-* --weight-decay --adam-* --clip-grad), data (--data-path
# --split --data-impl mmap --eod-mask-loss --reset-position-ids --reset-attention-mask), logging
# (--log-interval --eval-interval --eval-iters --tensorboard-dir), checkpoints (--save DIR
# --save-interval N, --load DIR to resume, --exit-interval, --keep-last-n-checkpoints), engine
# (--device --no-jit --seed), parallelism (--nproc-per-node, --tensor-model-parallel-size,
# --pipeline-model-parallel-size), precision (--fp16/--mixed-precision, loss-scale flags; --bf16,
# emulated on CPU), recompute (--recompute-*, --checkpoint-activations), ZeRO stages 1, 2 and 3
# (--use-distributed-optimizer, --zero-1-memory-optimization, --zero-2-memory-optimization,
# --zero-3-memory-optimization / --fsdp-memory-optimization). Not in this build yet, refused with
# an explanation: the interleaved pipeline schedule and uneven pipeline stages.
# Resume an interrupted run: launch/pretrain_gpt.sh --save ckpt --save-interval 20 --load ckpt
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -z "${DATA_PATH:-}" ]]; then
    DATA_PATH="$(demo_corpus_path data_prefix)"
    VOCAB_FILE="${VOCAB_FILE:-$(demo_corpus_path vocab_file)}"
    MERGE_FILE="${MERGE_FILE:-$(demo_corpus_path merge_file)}"
fi
: "${VOCAB_FILE:?set VOCAB_FILE (and MERGE_FILE) to the tokenizer DATA_PATH was preprocessed with}"
: "${MERGE_FILE:?set MERGE_FILE to the merges.txt that goes with VOCAB_FILE}"

GPT_ARGS=(
    "${SMALL_MODEL_ARGS[@]}"
    --train-iters 100
    --lr 6e-4
    --min-lr 6e-5
    --lr-decay-style cosine
    --lr-warmup-fraction 0.01
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
    --init-method-std 0.02
    --hidden-dropout 0.1
    --attention-dropout 0.1
)
# DATA_PATH is split on spaces on purpose: "0.3 a_text_document 0.7 b_text_document" blends.
read -r -a DATA_PREFIXES <<< "$DATA_PATH"
DATA_ARGS=(
    --data-path "${DATA_PREFIXES[@]}"
    --data-impl mmap
    --split 949,50,1
    --tokenizer-type GPT2BPETokenizer
    --vocab-file "$VOCAB_FILE"
    --merge-file "$MERGE_FILE"
)
OUTPUT_ARGS=(
    --log-interval 10
    --eval-interval 50
    --eval-iters 10
)

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/pretrain_gpt.py" \
    "${GPT_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" "${TENSORBOARD_ARGS[@]}" "$@"
