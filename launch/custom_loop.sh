#!/usr/bin/env bash
# A hand-written training loop over engine.compose(): user_scripts/custom_loop.py.
#
#   launch/custom_loop.sh                           # tiny GPT on the demo corpus, 100 steps
#   launch/custom_loop.sh --train-iters 300 --hidden-size 128
#   DATA_PATH=my-corpus_text_document VOCAB_FILE=vocab.json MERGE_FILE=merges.txt launch/custom_loop.sh
#
# Environment: DATA_PATH (unset: the script uses the demo corpus), VOCAB_FILE, MERGE_FILE,
# RAPIDGPT, PYTHON (see launch/common.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ARGS=(
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 32
    --micro-batch-size 8
    --train-iters 100
    --lr 3e-3
    --lr-decay-style cosine
    --lr-warmup-fraction 0.05
    --log-interval 10
)
if [[ -n "${DATA_PATH:-}" ]]; then
    : "${VOCAB_FILE:?set VOCAB_FILE (and MERGE_FILE) to the tokenizer DATA_PATH was preprocessed with}"
    : "${MERGE_FILE:?set MERGE_FILE to the merges.txt that goes with VOCAB_FILE}"
    read -r -a DATA_PREFIXES <<< "$DATA_PATH"
    ARGS+=(--data-path "${DATA_PREFIXES[@]}" --tokenizer-type GPT2BPETokenizer
           --vocab-file "$VOCAB_FILE" --merge-file "$MERGE_FILE")
fi

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/custom_loop.py" "${ARGS[@]}" "$@"
