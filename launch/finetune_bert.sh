#!/usr/bin/env bash
# Finetune BERT on sentence pairs with the example Finetuner user_scripts/finetune_bert.py.
#
#   launch/finetune_bert.sh                          # next-sentence pairs of the demo documents, fresh BERT
#   PRETRAINED=ckpt/bert launch/finetune_bert.sh     # from launch/pretrain_bert.sh --save ckpt/bert
#   PRETRAINED=./bert-base-cased launch/finetune_bert.sh --data-path train.tsv --valid-data-path dev.tsv \
#       --seq-length 128 --micro-batch-size 32 --epochs 3 --lr 2e-5      # a Hugging Face folder, MRPC-style .tsv
#
# Environment: PRETRAINED (a RapidGPT BERT checkpoint or a local Hugging Face BERT folder; its
# architecture and vocabulary are used), VOCAB_FILE (without PRETRAINED: default the demo's),
# RAPIDGPT, PYTHON. Script flags: --train-size, --valid-size (made-up pairs).
# The black-box equivalent: rapidgpt --task sequence_classification --pretrained-model-name-or-path DIR ...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -n "${PRETRAINED:-}" ]]; then
    MODEL_ARGS=(--pretrained-model-name-or-path "$PRETRAINED")
else
    MODEL_ARGS=(
        --tokenizer-type BertWordPieceLowerCase
        --vocab-file "${VOCAB_FILE:-$(demo_bert_corpus_path vocab_file)}"
        --num-layers 4
        --hidden-size 256
        --num-attention-heads 4
    )
fi
ARGS=(
    --seq-length 64
    --micro-batch-size 16
    --epochs 3
    --lr 1e-4
    --lr-decay-style linear
    --lr-warmup-fraction 0.1
    --weight-decay 0.01
    --log-interval 16
)

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/finetune_bert.py" "${MODEL_ARGS[@]}" "${ARGS[@]}" "$@"
