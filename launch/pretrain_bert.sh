#!/usr/bin/env bash
# Megatron-style BERT pretraining with the example trainer user_scripts/pretrain_bert.py.
#
#   launch/pretrain_bert.sh                          # demo documents as BERT data, BERT 4 x 256, 200 iterations
#   DATA_PATH=my-corpus_text_sentence VOCAB_FILE=vocab.txt launch/pretrain_bert.sh
#   launch/pretrain_bert.sh --save ckpt/bert --bert-no-binary-head     # any flag after the script wins
#
# Environment:
#   DATA_PATH    sentence-level .bin/.idx prefix (data_tools/preprocess_data.py --split-sentences);
#                default: the embedded demo documents, with a WordPiece vocabulary made from them
#   VOCAB_FILE   the vocab.txt the data was preprocessed with (BertWordPieceLowerCase)
#   TENSORBOARD_DIR, RAPIDGPT, PYTHON (see launch/common.sh)
# The black-box equivalent: rapidgpt --task pretraining --tokenizer-type BertWordPieceLowerCase ...
# Tensor, pipeline and data parallelism, precision, recompute and ZeRO as for GPT (launch/pretrain_gpt.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -z "${DATA_PATH:-}" ]]; then
    DATA_PATH="$(demo_bert_corpus_path data_prefix)"
    VOCAB_FILE="${VOCAB_FILE:-$(demo_bert_corpus_path vocab_file)}"
fi
: "${VOCAB_FILE:?set VOCAB_FILE to the vocab.txt DATA_PATH was preprocessed with}"

BERT_ARGS=(
    "${SMALL_MODEL_ARGS[@]}"
    --train-iters 200
    --lr 1e-3
    --min-lr 1e-4
    --lr-decay-style linear
    --lr-warmup-fraction 0.05
    --weight-decay 0.01
    --clip-grad 1.0
    --mask-prob 0.15
    --short-seq-prob 0.1
)
read -r -a DATA_PREFIXES <<< "$DATA_PATH"
DATA_ARGS=(
    --data-path "${DATA_PREFIXES[@]}"
    --split 949,50,1
    --tokenizer-type BertWordPieceLowerCase
    --vocab-file "$VOCAB_FILE"
)
OUTPUT_ARGS=(
    --log-interval 10
    --eval-interval 100
    --eval-iters 10
)

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/pretrain_bert.py" \
    "${BERT_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" "${TENSORBOARD_ARGS[@]}" "$@"
