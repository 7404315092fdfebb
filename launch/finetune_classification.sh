#!/usr/bin/env bash
# Finetune a GPT backbone + classification head on a synthetic topic corpus:
# user_scripts/finetune_classification.py (a Finetuner with its own dataset and a custom flag).
#
#   launch/finetune_classification.sh                       # 3 topics, 4 epochs, ~30 s on 2 CPU cores
#   launch/finetune_classification.sh --num-classes 5 --epochs 6
#
# Environment: VOCAB_FILE, MERGE_FILE (default: the demo corpus's GPT-2 BPE), RAPIDGPT, PYTHON.
# Script flags: --num-classes (2..5), --train-size, --valid-size.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

VOCAB_FILE="${VOCAB_FILE:-$(demo_corpus_path vocab_file)}"
MERGE_FILE="${MERGE_FILE:-$(demo_corpus_path merge_file)}"

ARGS=(
    --tokenizer-type GPT2BPETokenizer
    --vocab-file "$VOCAB_FILE"
    --merge-file "$MERGE_FILE"
    --num-classes 3
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 32
    --micro-batch-size 16
    --epochs 4
    --lr 2e-3
    --lr-decay-style linear
    --lr-warmup-fraction 0.05
    --weight-decay 0.01
    --log-interval 12
)

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/finetune_classification.py" "${ARGS[@]}" "$@"
