#!/usr/bin/env bash
# Black-box GPT pretraining: `rapidgpt --task pretraining`, no user file.
#
#   launch/pretraining_task.sh                      # the embedded demo corpus; prints a continuation
#   DATA_PATH=my-corpus_text_document VOCAB_FILE=vocab.json MERGE_FILE=merges.txt launch/pretraining_task.sh
#   launch/pretraining_task.sh --train-iters 20 --prompt "The with statement"
#
# Environment: DATA_PATH (unset: the task uses the demo corpus and its tokenizer), VOCAB_FILE,
# MERGE_FILE, TENSORBOARD_DIR, RAPIDGPT, PYTHON (see launch/common.sh).
# The same switches as launch/pretrain_gpt.sh apply (the task is that trainer, built in).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL_ARGS=(
    "${SMALL_MODEL_ARGS[@]}"
    --train-iters 100
    --lr 6e-4
    --min-lr 6e-5
    --lr-decay-style cosine
    --lr-warmup-fraction 0.01
    --weight-decay 0.1
    --clip-grad 1.0
    --log-interval 10
    --eval-interval 50
    --eval-iters 10
)
DATA_ARGS=()
if [[ -n "${DATA_PATH:-}" ]]; then
    : "${VOCAB_FILE:?set VOCAB_FILE (and MERGE_FILE) to the tokenizer DATA_PATH was preprocessed with}"
    : "${MERGE_FILE:?set MERGE_FILE to the merges.txt that goes with VOCAB_FILE}"
    read -r -a DATA_PREFIXES <<< "$DATA_PATH"
    DATA_ARGS=(--data-path "${DATA_PREFIXES[@]}" --split 949,50,1 --tokenizer-type GPT2BPETokenizer
               --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE")
fi

exec "$RAPIDGPT" --task pretraining "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" "${TENSORBOARD_ARGS[@]}" "$@"
