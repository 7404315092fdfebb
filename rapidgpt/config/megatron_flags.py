"""Every Megatron-LM flag has an answer, so no Megatron command line meets "unknown flag".

The flags are those of Megatron-LM's megatron/training/arguments.py, and the ModelOpt group its
pretrain_gpt.py adds, at the commit named in rapidgpt/config/megatron_flag_shapes.py (generated
from Megatron's own parser, with how it reads each one). A flag is, in this order:
1. RapidGPT's own flag, with Megatron's meaning (rapidgpt/arguments.py and the rapidgpt/config/
   modules define it; rapidgpt/config/implementation_choices.py's accepted choices among them);
2. an implementation choice (IMPLEMENTATION): accepted whatever its value, with one start-up line
   saying what it means here; it changes no number the run computes;
3. refused (REFUSED): a value other than Megatron's default stops the run with one line naming
   the feature that is not built and what to do instead. The default value itself (a launch
   script that spells out a default) passes, and so do the values of ACCEPTED_VALUES, which ask
   for what RapidGPT does (e.g. `--spec local`), with one start-up line.

The table is `answers()`; `python -m rapidgpt.config.megatron_flags` prints it as the README's
section "Megatron-LM flags". Importing this module imports nothing heavy (flags are checked
before MindSpore loads).
"""
import argparse
import fnmatch
import sys

from rapidgpt.config.megatron_flag_shapes import COMMIT, SHAPES

# flag pattern (fnmatch) -> what it means here. Checked before REFUSED.
IMPLEMENTATION = {
    # kernels and fusions: MindSpore compiles the step and fuses its kernels
    "--no-masked-softmax-fusion": "attention's softmax is compiled with the step; MindSpore chooses its kernels",
    "--no-bias-swiglu-fusion": "the MLP is compiled with the step; MindSpore fuses its elementwise ops",
    "--no-bias-dropout-fusion": "dropout and the residual are compiled with the step; MindSpore fuses them",
    "--no-rope-fusion": "RoPE is compiled with the step; MindSpore fuses its elementwise ops",
    "--no-persist-layer-norm": "there is no persistent LayerNorm kernel; norms are compiled with the step",
    "--no-gradient-accumulation-fusion": "gradients of the micro-batches are summed inside the compiled step",
    "--cross-entropy-fusion-impl": "the loss is part of the compiled step, whose kernels MindSpore fuses",
    "--use-flash-attn": "attention is RapidGPT's softmax attention, compiled and fused by MindSpore",
    "--flash-attention-version": "attention is RapidGPT's softmax attention, compiled and fused by MindSpore",
    "--fused-residual-rmsnorm": "norms and residuals are compiled with the step; MindSpore fuses them",
    "--use-transformer-engine-op-fuser": "there is no Transformer Engine; MindSpore fuses the compiled step",
    "--use-te-activation-func": "there is no Transformer Engine; the activation is compiled with the step",
    "--disable-jit-fuser": "there is no TorchScript fuser; graph kernel fusion is --graph-kernel-fusion",
    "--mla-down-proj-fusion": "multi-latent attention's down projections are compiled with the step; MindSpore "
                              "fuses its kernels",
    "--no-gradient-reduce-div-fusion": "the gradient scaling is part of the compiled step",
    "--no-clone-scatter-output-in-embedding": "the embedding's output is not a scattered view that needs a copy",
    "--te-rng-tracker": "dropout's random streams are RapidGPT's own (one per parallel rank and layer)",
    "--disable-bf16-reduced-precision-matmul": "a PyTorch/cuBLAS switch; MindSpore's kernels decide",
    "--use-cpu-initialization": "weights are initialized whole from the seed, then split over the TP ranks, "
                                "so every layout starts from the same model",
    "--deterministic-mode": "RapidGPT has no second set of kernels for it; on the CPU a run repeats bit for bit",
    "--batch-invariant-mode": "an inference-kernel choice; training kernels are MindSpore's",
    "--batch-invariant-backend": "see --batch-invariant-mode",
    "--tensorboard-queue-size": "tensorboardX writes the events; its queue size is its own",
    "--log-validation-ppl-to-tensorboard": "the validation perplexity is always written to TensorBoard "
                                           "(`lm loss validation ppl`)",
    # communication: the compiled step's runtime schedules the collectives
    "--tp-comm-overlap": "tensor-parallel communication overlap is Transformer Engine's; MindSpore's runtime "
                         "schedules the collectives, with the same numbers",
    "--tp-comm-overlap-cfg": "see --tp-comm-overlap",
    "--tp-comm-overlap-rs-dgrad": "see --tp-comm-overlap",
    "--tp-comm-bootstrap-backend": "see --tp-comm-overlap",
    "--no-tp-comm-*": "see --tp-comm-overlap",
    "--ddp-num-buckets": "gradients are reduced inside the compiled step, not in buckets issued by hand",
    "--ddp-bucket-size": "gradients are reduced inside the compiled step, not in buckets issued by hand",
    "--ddp-pad-buckets-for-high-nccl-busbw": "gradients are reduced inside the compiled step, not in buckets",
    "--ddp-average-in-collective": "the gradients' average over data-parallel ranks is the same either way",
    "--no-align-grad-reduce": "gradient reduction is scheduled by MindSpore's runtime",
    "--no-align-param-gather": "ZeRO's parameter gathers are scheduled by MindSpore's runtime",
    "--overlap-param-gather-with-optimizer-step": "ZeRO's parameter gathers are scheduled by MindSpore's runtime",
    "--nccl-communicator-config-path": "collectives use MindSpore's communication for the device",
    "--use-sharp": "collectives use MindSpore's communication for the device",
    "--sharp-enabled-group": "collectives use MindSpore's communication for the device",
    "--high-priority-stream-groups": "collectives use MindSpore's communication for the device",
    "--disable-gloo-process-groups": "there are no gloo process groups",
    "--use-nccl-ub": "NCCL user buffers are a GPU allocator choice; MindSpore manages its memory",
    "--disable-symmetric-registration": "NCCL memory registration is a GPU allocator choice",
    "--create-all-gather-group": "ZeRO's gathers use the data-parallel group",
    "--pipeline-model-parallel-comm-backend": "pipeline stages exchange activations through MindSpore's "
                                              "communication for the device",
    "--use-ring-exchange-p2p": "pipeline stages exchange activations through MindSpore's communication",
    "--local-rank": "msrun (or the rapidgpt command) gives every process its rank",
    # knowledge distillation (rapidgpt/config/distillation.py)
    "--export-kd-teacher-ckpt-format": "the teacher is a RapidGPT checkpoint (or Hugging Face folder), read in the "
                                       "format its files record; convert a Megatron-LM one with "
                                       "data_tools/convert_megatron.py",
    "--export-te-mcore-model": "the layers are RapidGPT's own; there is no Transformer Engine layer spec",
    "--distributed-timeout-seconds-after-init": "see --distributed-timeout-minutes",
    "--flight-recorder-*": "the NCCL flight recorder is PyTorch's; a failed rank is named in the log",
    "--no-flight-recorder-*": "the NCCL flight recorder is PyTorch's; a failed rank is named in the log",
    "--tensor-parallel-num-weight-shards": "weights are split over the TP ranks only",
    "--delay-wgrad-compute": "the backward's order is the compiled step's, scheduled by MindSpore",
    "--defer-embedding-wgrad-compute": "the pipeline's backward order is RapidGPT's 1F1B schedule",
    "--wgrad-deferral-limit": "see --defer-embedding-wgrad-compute",
    "--overlap-p2p-communication-warmup-flush": "pipeline sends and receives are RapidGPT's own (rapidgpt/parallel/"
                                                "comm.py); overlapping them changes no number",
    "--no-overlap-p2p-communication": "see --overlap-p2p-communication-warmup-flush",
    "--load-main-params-from-ckpt": "checkpoints hold the fp32 (main) weights, which a load always reads",
    # checkpoints: RapidGPT's own format, written by every rank, layout-free and verified
    "--async-save": "checkpoints are written before training goes on (the same files, verified)",
    "--async-strategy": "see --async-save",
    "--use-persistent-ckpt-worker": "see --async-save",
    "--async-ckpt-*": "see --async-save",
    "--ckpt-fully-parallel-save": "every rank writes its own part of RapidGPT's checkpoints already",
    "--no-ckpt-fully-parallel-save": "every rank writes its own part of RapidGPT's checkpoints",
    "--ckpt-fully-parallel-load": "every rank reads what it needs of RapidGPT's checkpoints",
    "--ckpt-fully-parallel-*": "RapidGPT's checkpoints are written and read by every rank",
    "--ckpt-assume-constant-structure": "RapidGPT's checkpoints are written whole at every save",
    "--ckpt-pg-tensors-cache-*": "RapidGPT's checkpoints are layout-free; nothing is cached between saves",
    "--no-ckpt-load-validate-sharding-integrity": "RapidGPT verifies every file it loads (size and CRC)",
    "--dist-ckpt-strictness": "a checkpoint's tensors must match the model; a mismatch is named",
    "--dist-ckpt-save-pre-mcore-014": "RapidGPT writes its own checkpoint format",
    "--dist-ckpt-optim-fully-reshardable": "RapidGPT's checkpoints (optimizer state included) load at any layout",
    "--distrib-optim-fully-reshardable-mem-efficient": "RapidGPT's checkpoints load at any layout",
    "--use-dist-ckpt": "RapidGPT's checkpoints load at any TP/PP/DP, as Megatron's distributed ones do",
    "--dist-ckpt-format": "RapidGPT writes its own checkpoint format (--ckpt-format ckpt or safetensors)",
    "--dist-ckpt-workers": "every rank writes its own part of RapidGPT's checkpoints",
    "--auto-detect-ckpt-format": "RapidGPT reads its own format (Megatron checkpoints: convert them first)",
    "--ckpt-drop-redundant-extra-state": "RapidGPT's checkpoints hold no Transformer Engine extra state",
    "--no-strict-fsdp-dtensor-load": "RapidGPT's checkpoints hold no FSDP DTensors",
    "--use-checkpoint-args": "RapidGPT takes the model flags a checkpoint records by default",
    "--use-mp-args-from-checkpoint-args": "checkpoints load at any TP/PP; the sizes given (or 1) are used",
    "--verify-integrity": "RapidGPT verifies every checkpoint file it loads (its size and CRC-32) whether or not "
                          "this is given, and names a damaged one",
    "--num-distributed-optimizer-instances": "the distributed optimizer shards its state over the whole data-parallel "
                                             "group (one instance); more instances trade memory for communication, "
                                             "the updates are the same",
    "--no-use-tokenizer-model-from-checkpoint-args": "a tokenizer given on the command line is used; "
                                                     "otherwise the checkpoint's own",
    "--no-save-tokenizer-assets": "checkpoints carry the tokenizer's (small) files anyway",
    # host-side habits of Megatron's loop on GPUs
    "--exit-signal-handler": "RapidGPT always saves a checkpoint and stops at the next step on SIGTERM/SIGINT",
    "--exit-signal-handler-for-dataloader": "see --exit-signal-handler",
    "--exit-signal-handler-for-training": "see --exit-signal-handler",
    "--manual-gc-interval": "the step is one compiled graph; Python's garbage collector does not run inside it",
    "--no-manual-gc-eval": "see --manual-gc-interval",
    "--train-sync-interval": "the host waits for every step's loss, so it never runs ahead",
    "--no-pin-cpu-grads": "there is no CPU offloading to pin memory for",
    "--no-pin-cpu-params": "there is no CPU offloading to pin memory for",
    "--record-shapes": "see --profile",
    "--nvtx-ranges": "NVTX ranges are NVIDIA's; there is no such profiler hook on this backend",
    "--enable-cuda-graph": "CUDA graphs capture a step for replay; RapidGPT's step is one compiled graph already",
    "--cuda-graph-*": "see --enable-cuda-graph",
    "--external-cuda-graph": "see --enable-cuda-graph",
    "--optimizer-cuda-graph": "see --enable-cuda-graph",
    "--config-logger-dir": "the start-up lines and checkpoints' metadata.json record the configuration",
}

# (what is not built and what to do instead, flag patterns, Megatron argument groups): the first that
# matches answers a flag.
REFUSED = [
    ("mixture of experts (MoE) is not built: the decoder's MLP is dense",
     ("--moe-*", "--num-experts", "--expert-*", "--overlap-moe-expert-parallel-comm", "--ep-overlap-*",
      "--overlap-dispatch-backward-with-experts-wgrad", "--high-priority-a2a-comm-stream", "--use-grouped-gemm-*",
      "--gtp-expert-remat-nccl-ub"), ("moe",)),
    ("FP8/FP4 training is not built (Transformer Engine on Hopper/Blackwell GPUs); use --bf16 or --fp16",
     ("--fp8*", "--fp4*", "--no-fp8-wgrad", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
      "--num-layers-at-end-in-bf16", "--keep-fp8-transpose-cache", "--reuse-grad-buf-for-mxfp8-param-ag",
      "--te-precision-config-file", "--use-kitchen-attention", "--kitchen-attention-backend"), ("Transformer-Engine",)),
    ("Transformer Engine's precision-aware optimizer (main weights and Adam state below fp32) is not built: "
     "they are fp32", ("--use-precision-aware-optimizer", "--main-grads-dtype", "--main-params-dtype",
                       "--exp-avg-dtype", "--exp-avg-sq-dtype"), ()),
    ("context parallelism is not built (--context-parallel-size 1 only); with tensor parallelism, "
     "--sequence-parallel splits activations along the sequence",
     ("--hierarchical-context-parallel-sizes", "--max-seqlen-per-dp-cp-rank", "--hybrid-context-parallel",
      "--cp-comm-type"), ()),
    ("T5 and other encoder-decoder models are not built (decoder-only GPT/Llama and BERT are)",
     ("--encoder-num-layers", "--decoder-num-layers", "--encoder-seq-length", "--decoder-seq-length",
      "--relative-attention-num-buckets", "--relative-attention-max-distance", "--vocab-extra-ids"), ()),
    ("Mamba, hybrid, linear-attention and sparse-attention layers are not built (the decoder's attention is "
     "full softmax attention)",
     ("--is-hybrid-model", "--mamba-*", "--hybrid-*", "--gdp-*", "--disable-mamba-mem-eff-path", "--linear-*",
      "--experimental-attention-variant", "--dsa-*", "--no-dsa-*"),
     ("experimental_attention_variant",)),
    ("caching multi-latent attention's latents in generation is not built: generation caches each head's keys "
     "and values", ("--cache-mla-latents",), ()),
    ("multi-token prediction (MTP) is not built", ("--mtp-*",), ()),
    ("custom layer specs are not built: the built-in models are chosen by their flags", ("--spec",), ()),
    ("Megatron-RL (GRPO rollouts) is not built", ("--grpo-*", "--rl-*", "--refit-method", "--langrl-env-config"),
     ("rl",)),
    ("Megatron's inference engine (dynamic batching, CUDA-graph decoding, its text-generation server) is not "
     "built; RapidGPT generates with --task text_generation",
     ("--inference-*", "--flash-decode", "--nccl-all-reduce-for-prefill", "--symmetric-ar-type",
      "--mlp-chunks-for-prefill", "--use-same-sampling-seed-across-dp-ranks", "--decode-only-cuda-graphs",
      "--enable-chunked-prefill", "--num-speculative-tokens", "--use-legacy-static-engine", "--max-tokens-to-oom",
      "--output-bert-embeddings", "--bert-embedder-type"), ("inference",)),
    ("vision models (ViT, Swin, DINO) are not built", (), ("vision",)),
    ("the biencoder / ICT retriever models are not built", (), ("biencoder",)),
    ("logits distillation is not built", (), ("Logits Distillation",)),
    ("NVIDIA Resiliency Extension's in-process restart is not built; a failed rank stops the job, which "
     "resumes from its last checkpoint (--load)", (), ("In-process restart",)),
    ("NVIDIA's fault-tolerance package is not built; a failed rank stops the job, which resumes from its last "
     "checkpoint (--load)", (), ("ft_package",)),
    ("Megatron's fault injector is not built", (), ("fault injector",)),
    ("the straggler detector is not built (the iteration line shows each step's time)", (), ("straggler",)),
    ("the workload inspector server is not built", (), ("workload inspector",)),
    ("ADLR autoresume is not built; resume with --load", (), ("autoresume",)),
    ("NVIDIA's one-logger is not built; use --tensorboard-dir", (), ("one logger",)),
    ("OpenTelemetry tracing is not built; use --tensorboard-dir", (), ("opentelemetry",)),
    ("the Multi-Storage Client (object storage) is not built: give local paths",
     ("--object-storage-cache-path",), ("msc",)),
    ("this Megatron-FSDP / FSDP2 option (buffers, versions, hybrid sharding) is not built; --use-megatron-fsdp with "
     "--data-parallel-sharding-strategy, and --use-torch-fsdp2, shard the model states as ZeRO does",
     ("--megatron-fsdp-*", "--fsdp-*", "--outer-dp-sharding-strategy", "--torch-fsdp2-*", "--enable-full-sharding-in-hsdp",
      "--suggested-communication-unit-size", "--init-model-with-meta-device",
      "--no-use-layer-wise-param-layout", "--fsdp-manual-registration"), ()),
    ("weight rematerialization over a second tensor-parallel axis (GTP) is not built", ("--gtp-*",), ()),
    ("reducing gradients with fp32 accumulation per parameter pattern is not built; "
     "--accumulate-allreduce-grads-in-fp32 reduces all 16-bit gradients in fp32",
     ("--ddp-reduce-scatter-with-fp32-accumulation", "--ddp-param-name-patterns-for-fp32-local-accumulation"), ()),
    ("a custom pipeline layout string is not built; --decoder-first/last-pipeline-num-layers, "
     "--account-for-embedding/loss-in-pipeline-split and --num-virtual-stages-per-pipeline-rank shape the split",
     ("--pipeline-model-parallel-layout",), ()),
    ("CPU offloading of activations, weights or optimizer state is not built; --recompute-* trades compute for "
     "activation memory, ZeRO (--zero-*-memory-optimization) shards optimizer state",
     ("--cpu-offloading-*", "--fine-grained-activation-offloading", "--offload-modules", "--min-offloaded-tensor-size",
      "--delay-offload-until-cuda-graph", "--delta-offload-bytes-across-pp-ranks", "--activation-offload-fraction",
      "--fine-grained-offloading-max-inflight-offloads", "--optimizer-cpu-offload", "--optimizer-offload-fraction",
      "--use-torch-optimizer-for-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d"), ()),
    ("distributing the recomputed layers' saved inputs over the TP ranks is not built (--sequence-parallel "
     "splits them)", ("--distribute-saved-activations",), ()),
    ("the Muon and Lion optimizers are not built (--optimizer adam or sgd)", ("--muon-*", "--lion-*"), ()),
    ("this RoPE variant is not built (RoPE with --rotary-base, --rotary-percent, --rotary-interleaved, and "
     "Llama 3.1's --use-rope-scaling; YaRN with --multi-latent-attention)",
     ("--yarn-*", "--no-yarn-*", "--rotary-seq-len-interpolation-factor", "--no-rope-freq", "--mrope-section"), ()),
    ("sliding-window attention is not built (attention is causal over the whole sequence)",
     ("--window-size", "--window-attn-skip-freq"), ()),
    ("this MLP activation is not built (GELU, --squared-relu, or SwiGLU with --swiglu)",
     ("--quick-geglu", "--use-fused-weighted-squared-relu", "--glu-linear-offset",
      "--activation-func-clamp-value"), ()),
    ("this attention variant is not built (softmax attention, with --qk-layernorm, --add-qkv-bias and "
     "--group-query-attention)",
     ("--qk-l2-norm", "--qk-clip", "--qk-clip-*", "--attention-output-gate", "--softmax-type"), ()),
    ("hyper-connections (mHC) are not built", ("--enable-mhc-connections", "--mhc-*"), ()),
    ("this residual and norm placement is not built (pre-norm residuals in the model's dtype)",
     ("--apply-residual-connection-post-layernorm", "--fp32-residual-connection"), ()),
    ("this initialization is not built (normal with --init-method-std, output layers scaled by depth, the "
     "embeddings' with --embedding-init-method-std)",
     ("--init-method-xavier-uniform", "--no-initialization",
      "--data-parallel-random-init"), ()),
    ("the MLP chunking of the training step is not built", ("--mlp-chunks-for-training",), ()),
    ("this recompute option is not built (--recompute-granularity full or selective, --recompute-method, "
     "--recompute-num-layers)", ("--recompute-modules",), ()),
    ("Megatron's weight-decay schedule and its map of parameter groups are not built (a constant --weight-decay "
     "on matrices, none on biases and norms but the q/k norms' with --apply-wd-to-qk-layernorm)",
     ("--start-weight-decay", "--end-weight-decay", "--weight-decay-incr-style",
      "--dump-param-to-param-group-map"), ()),
    ("freezing all layers is not built", ("--freeze-all-layers",), ()),
    ("an old Megatron spelling: use --micro-batch-size, --lr-warmup-iters or --tensor-model-parallel-size",
     ("--batch-size", "--warmup", "--model-parallel-size"), ()),
    ("this batch-size option is not built (--rampup-batch-size and --step-batch-size-schedule are)",
     ("--decrease-batch-size-if-needed", "--phase-transition-iterations"), ()),
    ("Megatron's GPU health checks are not built (--test-mode and "
     "--check-weight-hash-across-dp-replicas-interval compare the ranks' copies of the weights)",
     ("--gpu-sniff-test-interval",), ()),
    ("the exit signal is SIGTERM (or SIGINT); another is not built", ("--exit-signal",), ()),
    ("PyTorch's profiler and CUDA memory history are not built (see --profile)",
     ("--use-pytorch-profiler", "--pytorch-profiler-*", "--profile-ranks", "--record-memory-history",
      "--memory-snapshot-path"), ()),
    ("this checkpoint schedule is not built (--save-interval, --save-retain-interval, --keep-last-n-checkpoints)",
     ("--save-params-interval", "--save-activations-interval", "--save-tokens-per-expert-interval",
      "--save-wgrads-interval", "--save-dgrads-interval", "--non-persistent-*",
      "--replication", "--replication-*"), ()),
    ("loading a chosen checkpoint iteration is not built (--load reads the latest complete one; copy the "
     "iteration you want into a folder of its own)", ("--ckpt-step", "--override-ckpt-iteration"), ()),
    ("Megatron's checkpoint conversion on load is not built: use data_tools/convert_checkpoint.py",
     ("--ckpt-convert-format", "--ckpt-convert-save", "--ckpt-convert-update-legacy-dist-opt-format"), ()),
    ("a missing checkpoint under --load starts the run from scratch here; an exit instead is not built",
     ("--exit-on-missing-checkpoint",), ()),
    ("a separate evaluation batch size and evaluation schedule are not built (evaluation uses the training "
     "batch, every --eval-interval)",
     ("--start-eval-at-iter", "--eval-global-batch-size", "--eval-micro-batch-size", "--full-validation",
      "--multiple-validation-sets", "--validation-set-names"), ()),
    ("this data option is not built (give --data-path, or --train/valid/test-data-path, with weights)",
     ("--data-args-path", "--per-split-data-args-path", "--per-dataset-sequences-path", "--dataloader-fast-cache-load",
      "--dataloader-defer-npy-index-mmap", "--sample-rate", "--num-dataset-builder-threads",
      "--mid-level-dataset-surplus", "--allow-ambiguous-pad-tokens", "--dataloader-type"), ()),
    ("attention restricted to each document of a sample is not built (documents in a sample attend to each "
     "other, as Megatron's default)", ("--dataloader-inter-document-masking",), ()),
    ("this vocabulary-size option is not built (the vocabulary is padded to --make-vocab-size-divisible-by x TP)",
     ("--padded-vocab-size", "--no-pad-vocab-size"), ()),
    ("this tokenizer option is not built (--tokenizer-type with --vocab-file/--merge-file or --tokenizer-model)",
     ("--tokenizer-metadata", "--tokenizer-sentencepiece-legacy",
      "--no-tokenizer-sentencepiece-ignore-extra-whitespaces", "--tokenizer-hf-*", "--trust-remote-code",
      "--null-tokenizer-*", "--use-gigatoken"), ()),
    ("this logging option is not built (the iteration line, --log-throughput, --timing-log-level and "
     "--tensorboard-dir)",
     ("--log-progress", "--no-log-loss-scale-to-tensorboard",
      "--log-memory-interval",
      "--log-device-memory-used", "--no-barrier-with-level-1-timing",
      "--log-world-size-to-tensorboard", "--logging-level", "--log-energy", "--log-max-attention-logit"), ()),
    ("Megatron's experimental switches and YAML configuration are not built (flags only)",
     ("--enable-experimental", "--yaml-cfg"), ()),
    ("this mixed-precision option is not built (the logits are computed in the model's dtype, the loss in fp32)",
     ("--fp16-lm-cross-entropy", "--output-logit-dtype"), ()),
    ("lazy or fake process groups are not built (msrun starts every rank)",
     ("--lazy-mpu-init", "--fake-process-group", "--use-tp-pp-dp-mapping"), ()),
    ("this legacy ONNX option is not built", ("--onnx-safe",), ()),
    ("Megatron's old spelling of --position-embedding-type none: use that", ("--no-position-embedding",), ()),
    ("heterogeneous layer configurations (per-layer shapes) are not built", (),
     ("heterogeneous architecture",)),
    ("NVIDIA ModelOpt's quantization, pruning, export and finetuning data (flags pretrain_gpt.py adds when "
     "ModelOpt is installed) are not built; its knowledge distillation is (--export-kd-teacher-load)", (),
     ("modelopt-generic",)),
]


# (refused flag, value) -> what it means here: values that ask for what RapidGPT does anyway.
ACCEPTED_VALUES = {
    ("--spec", "local"): "Megatron's local (non-Transformer-Engine) layer spec: the layers are RapidGPT's own, "
                         "the built-in model of the model flags",
}


# Other spellings of a flag's Megatron default (its parser converts them to the default).
DEFAULT_SPELLINGS = {"--exit-signal": ("SIGTERM",)}


def _dest(option):
    return "megatron_flag__" + option.lstrip("-").replace("-", "_")


def _matches(flag, patterns):
    return any(fnmatch.fnmatchcase(flag, pattern) for pattern in patterns)


def answer(flag, group):
    """("implementation", meaning) or ("refused", reason) of a Megatron flag RapidGPT does not define."""
    for pattern, meaning in IMPLEMENTATION.items():
        if fnmatch.fnmatchcase(flag, pattern):
            return "implementation", meaning
    for reason, patterns, groups in REFUSED:
        if _matches(flag, patterns) or group in groups:
            return "refused", reason
    return None


def answers(known):
    """{Megatron flag: (kind, text)} for every flag of SHAPES: kind "rapidgpt" for the flags in
    `known` (RapidGPT's option strings), else answer(...) (None: a flag without an answer)."""
    table = {}
    for options, _, _, _, _, group in SHAPES:
        for option in options:          # an alias (--disable-x for --no-x) answers as the flag
            table[option] = ("rapidgpt", "") if option in known else answer(options[0], group)
    return table


def _add(parser, options, kind, nargs, value_type, default):
    dest = _dest(options[0])
    common = dict(dest=dest, help=argparse.SUPPRESS)
    if kind in ("store_true", "store_false"):
        parser.add_argument(*options, action=kind, default=default, **common)
    elif kind == "boolean_optional":
        parser.add_argument(options[0], action=argparse.BooleanOptionalAction, default=default, **common)
    else:
        convert = {"int": int, "float": float}.get(value_type, str)
        parser.add_argument(*options, nargs=nargs, type=convert, default=default, **common)


def add_megatron_flags(parser):
    """Make every Megatron flag RapidGPT does not define parse (help hidden: the README lists them)."""
    known = set(parser._option_string_actions)
    for options, kind, nargs, value_type, default, _ in SHAPES:
        if not known.intersection(options):
            _add(parser, options, kind, nargs, value_type, default)


def check_megatron_flags(args, check):
    """Refuse the refused flags given a value other than Megatron's; remember the implementation
    choices given (`megatron_flag_lines`). Takes the flags' values off `args`, whose other values
    checkpoints record."""
    lines = list(getattr(args, "megatron_flag_lines", ()))      # validated twice: kept
    for options, kind, _, _, default, group in SHAPES:
        dest = _dest(options[0])
        if dest not in vars(args):
            continue
        value = vars(args).pop(dest)
        if value == default or value in DEFAULT_SPELLINGS.get(options[0], ()):
            continue
        spelled = " ".join(map(str, value)) if isinstance(value, list) else str(value)
        if (options[0], spelled) in ACCEPTED_VALUES:
            lines.append(f" > {options[0]} {spelled}: accepted; {ACCEPTED_VALUES[options[0], spelled]}")
            continue
        verdict, text = answer(options[0], group) or ("refused", f"Megatron's {group} option is not built")
        if verdict == "refused":
            check.add(f"{options[0]}: refused: {text}; remove it")
        else:
            lines.append(f" > {options[0]}: accepted; {text}")
    args.megatron_flag_lines = lines


def markdown(known):
    """The README's section on Megatron-LM's flags, from the table."""
    table = answers(known)
    implementation = {}
    refused = {}
    for flag, (kind, text) in table.items():
        if kind == "implementation":
            implementation.setdefault(text, []).append(flag)
        elif kind == "refused":
            refused.setdefault(text, []).append(flag)
    own = sum(kind == "rapidgpt" for kind, _ in table.values())
    out = [f"Of the {len(table)} flags of Megatron-LM's `megatron/training/arguments.py` and of the ModelOpt group "
           f"its `pretrain_gpt.py` adds when ModelOpt is installed (commit {COMMIT}), "
           f"{own} are RapidGPT's own, with Megatron's meaning; {sum(map(len, implementation.values()))} are "
           f"accepted as implementation choices (one start-up line each); {sum(map(len, refused.values()))} are "
           f"refused when given a value other than Megatron's default, each with the reason below. Generated "
           f"by `python -m rapidgpt.config.megatron_flags` from `rapidgpt/config/megatron_flags.py`.", "",
           "Accepted as implementation choices:", ""]
    out += [f"- {', '.join(f'`{f}`' for f in flags)}: {text}" for text, flags in implementation.items()]
    out += ["", "Refused:", ""]
    out += [f"- {', '.join(f'`{f}`' for f in flags)}: {text}" for text, flags in refused.items()]
    out += ["", "Accepted values of refused flags (one start-up line each):", ""]
    out += [f"- `{flag} {value}`: {text}" for (flag, value), text in ACCEPTED_VALUES.items()]
    return "\n".join(out) + "\n"


def rapidgpt_flags():
    """The option strings RapidGPT defines itself."""
    from rapidgpt.arguments import build_parser
    return set(build_parser(megatron_flags=False)._option_string_actions)


if __name__ == "__main__":
    sys.stdout.write(markdown(rapidgpt_flags()))
