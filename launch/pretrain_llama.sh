#!/usr/bin/env bash
# A Llama-3-style decoder with every flag of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh
# (its real-data branch; sizes made tiny, 2 processes of this machine: tensor parallel 2 with
# sequence parallelism and the distributed optimizer), trained by user_scripts/pretrain_gpt.py --
# Megatron's pretrain_gpt.py serves this family through flags, and so does ours. The data: the demo
# documents preprocessed with a Hugging Face tokenizer folder (the demo vocabulary as tokenizer.json),
# as that script's --tokenizer-type HuggingFaceTokenizer --tokenizer-model takes them. About 2
# minutes on 2 CPU cores.
#
#   launch/pretrain_llama.sh
#   launch/pretrain_llama.sh --train-samples 3200 --num-layers 8        # later flags win
#
# Differences from Megatron's script: --fp16 instead of --bf16 and the FP8 flags (a CPU has no FP8
# and runs bf16 only emulated, in fp32 tensors, slower than fp32; --grad-reduce-in-bf16 is kept and,
# as in Megatron, changes nothing outside --bf16); the FP8 flags themselves are left out. Flags accepted as implementation choices say so in one start-up line each
# (--use-mcore-models, --attention-backend, --profile, --ckpt-format torch_dist, ...).
# Environment: CHECKPOINT_PATH (default: a temporary folder), LOG_DIR, MASTER_PORT, TENSORBOARD_DIR,
# as for launch/single_node.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 2 --hidden-size 128 --ffn-hidden-size 448 --num-attention-heads 8
    --group-query-attention --num-query-groups 2 --kv-channels 16
    --seq-length 128 --max-position-embeddings 128
    --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0
    --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.0134 --attention-backend fused
    --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size 4 --global-batch-size 16 --train-samples 960
    --lr-decay-samples 900 --lr-warmup-samples 32 --lr 1.5e-3 --min-lr 1e-4
    --decoupled-lr 5.0e-3 --decoupled-min-lr 4.5e-4 --lr-decay-style cosine
    --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
    --fp16 --initial-loss-scale 4096 --loss-scale-window 5 --grad-reduce-in-bf16
    --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1
    --exit-duration-in-mins 235
)
PARALLEL_ARGS=(
    --nproc-per-node 2 --tensor-model-parallel-size 2 --context-parallel-size 1 --sequence-parallel
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
)
CHECKPOINT_PATH="${CHECKPOINT_PATH:-$(mktemp -d -t rapidgpt-llama3-XXXXXX)}"
DATA_ARGS=(
    --data-path "$(demo_hf_corpus_path data_prefix)" --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model "$(demo_hf_corpus_path tokenizer_model)" --data-cache-path "$CHECKPOINT_PATH-data-cache"
    --split "'99,1,0'" --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1
    --vocab-size 128256
)
LOGGING_ARGS=(
    --log-interval 5 --eval-iters 4 --eval-interval 30 --save-interval 1000 --log-throughput
    --profile --profile-step-start 4 --profile-step-end 6 --ckpt-format torch_dist --distributed-timeout-minutes 60
    --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --no-progress-bar
)
if [[ -n "${LOG_DIR:-}" ]]; then
    LOGGING_ARGS+=(--log-dir "$LOG_DIR")
fi
if [[ -n "${TENSORBOARD_DIR:-}" ]]; then
    LOGGING_ARGS+=(--tensorboard-dir "$TENSORBOARD_DIR")
fi

exec "$RAPIDGPT" --user-script "$REPO_ROOT/user_scripts/pretrain_gpt.py" "${MODEL_ARGS[@]}" "${TRAINING_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" "${DATA_ARGS[@]}" "${LOGGING_ARGS[@]}" "$@"
