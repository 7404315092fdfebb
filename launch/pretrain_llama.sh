#!/usr/bin/env bash
# A Llama-3-style decoder with the flags of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh
# (sizes made tiny, 2 processes of this machine: tensor parallel 2 with sequence parallelism and the
# distributed optimizer), trained by user_scripts/pretrain_gpt.py -- Megatron's pretrain_gpt.py
# serves this family through flags, and so does ours. About 2 minutes on 2 CPU cores.
#
#   launch/pretrain_llama.sh
#   launch/pretrain_llama.sh --train-iters 200 --num-layers 8        # later flags win
#
# Differences from Megatron's script: --fp16 instead of --bf16/FP8 (a CPU has neither), the demo
# corpus with its GPT-2 BPE tokenizer instead of a Hugging Face tokenizer folder, --normalization
# RMSNorm given (Llama's; Megatron's example leaves it to Transformer Engine's default). Left out,
# not yet in this build: --decoupled-lr/--decoupled-min-lr, --grad-reduce-in-bf16, the FP8 flags,
# --context-parallel-size, --mock-data, --tokenizer-type HuggingFaceTokenizer/NullTokenizer,
# --no-create-attention-mask-in-dataloader, --no-mmap-bin-files, --profile, --ckpt-format torch_dist.
# Environment: LOG_DIR, MASTER_PORT, TENSORBOARD_DIR, as for launch/single_node.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 2 --hidden-size 128 --ffn-hidden-size 448 --num-attention-heads 8
    --group-query-attention --num-query-groups 2 --kv-channels 16
    --seq-length 128 --max-position-embeddings 128
    --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
    --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0 --init-method-std 0.0134 --attention-backend fused
)
TRAINING_ARGS=(
    --micro-batch-size 4 --global-batch-size 16 --train-samples 960
    --lr-decay-samples 900 --lr-warmup-samples 32 --lr 1.5e-3 --min-lr 1e-4 --lr-decay-style cosine
    --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
    --fp16 --initial-loss-scale 4096 --loss-scale-window 5
    --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1
)
PARALLEL_ARGS=(
    --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
    --distributed-timeout-minutes 60
)
DATA_ARGS=(
    --data-path "$(demo_corpus_path data_prefix)" --tokenizer-type GPT2BPETokenizer
    --vocab-file "$(demo_corpus_path vocab_file)" --merge-file "$(demo_corpus_path merge_file)"
    --split "'99,1,0'" --num-workers 1
)
LOGGING_ARGS=(--log-interval 5 --eval-iters 4 --eval-interval 30 --log-throughput --no-progress-bar)
if [[ -n "${LOG_DIR:-}" ]]; then
    LOGGING_ARGS+=(--log-dir "$LOG_DIR")
fi
if [[ -n "${TENSORBOARD_DIR:-}" ]]; then
    LOGGING_ARGS+=(--tensorboard-dir "$TENSORBOARD_DIR")
fi

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}" "$@"
