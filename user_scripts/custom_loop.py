"""A training loop written by hand, with the engine's compiled update: `engine.compose(...)`.

    rapidgpt --user-script user_scripts/custom_loop.py \
        --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
        --micro-batch-size 8 --train-iters 100 --lr 1e-3 --log-interval 10

This is Rapidformer's "no-trainer" mode: no Pretrainer/Finetuner, you keep your own loop. The
engine still parses the Megatron flags, seeds everything, initialises the model's parameters,
builds AdamW and the learning-rate schedule from the flags, and runs each step as ONE compiled
forward/backward/clip/update graph:

    model, optimizer, lr_scheduler, loader = engine.compose(model, None, None, loader)
    for batch in loader:
        loss = optimizer.step(forward_fn, *batch)     # forward_fn(*batch) -> scalar loss
        if optimizer.last_updated:                    # False: an fp16 overflow skipped the step
            lr_scheduler.step(samples_in_this_step)

--fp16 / --mixed-precision and the recompute flags work here as in the templates: compose casts
the model and keeps fp32 main weights in the optimizer (rapidgpt/training/model_transforms.py).

Data: --data-path PREFIX (with --tokenizer-* flags or --vocab-size), or by default the embedded
demo corpus (Python's own documentation, built once into the cache directory).
"""
import time

import numpy as np

from rapidgpt import RapidGPTEngine, get_args, get_tokenizer
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.demo_corpus import demo_corpus
from rapidgpt.data.gpt_dataset import GPTDatasetConfig
from rapidgpt.models import build_gpt_model, lm_loss_func
from rapidgpt.tokenizer import GPT2BPETokenizer

engine = RapidGPTEngine()
args = get_args()
if not args.train_iters:
    args.train_iters = 100          # the default schedule below decays over this many iterations
if args.num_micro_batches != 1:
    raise SystemExit("custom_loop.py: error: this loop runs one batch per step; leave "
                     "--global-batch-size equal to --micro-batch-size")

# ---- data ------------------------------------------------------------------------------------
# Megatron's GPT dataset: samples of seq_length + 1 tokens, cut from the documents, shuffled.
if args.data_path:
    data_path, tokenizer = args.data_path, get_tokenizer()
    vocab_size = tokenizer.vocab_size if tokenizer is not None else args.vocab_size
    if vocab_size is None:
        raise SystemExit("custom_loop.py: error: with --data-path, give the tokenizer the data was "
                         "made with (--tokenizer-type/--vocab-file/--merge-file) or --vocab-size")
else:
    paths = demo_corpus()
    data_path = [paths["data_prefix"]]
    vocab_size = GPT2BPETokenizer(paths["vocab_file"], paths["merge_file"]).vocab_size

num_samples = args.train_iters * args.global_batch_size
train_ds, _, _ = build_train_valid_test_datasets(
    GPTDatasetConfig(seq_length=args.seq_length, seed=args.seed, data_cache_path=args.data_cache_path),
    [num_samples, 0, 0], data_path=data_path, split="100,0,0")


def batches(dataset, batch_size):
    """Consecutive samples of the (already shuffled) dataset, stacked into numpy batches."""
    for start in range(0, len(dataset) - batch_size + 1, batch_size):
        samples = [dataset[i] for i in range(start, start + batch_size)]
        yield {key: np.stack([s[key] for s in samples]) for key in samples[0]}


# ---- model, optimizer, schedule --------------------------------------------------------------
model = build_gpt_model(args, vocab_size)
num_parameters = sum(p.size for p in model.trainable_params())     # (ZeRO-3 leaves each rank its pieces)
# None, None: AdamW and Megatron's warmup + decay schedule from the flags (--lr, --lr-decay-style, ...)
model, optimizer, lr_scheduler, train_loader = engine.compose(
    model, None, None, batches(train_ds, args.global_batch_size))
model.set_train(True)               # dropout on (as torch's model.train())


def forward_fn(tokens, position_ids, labels, loss_mask):
    """Mean next-token cross-entropy of a batch. Compiled on the first step: tensor code only."""
    per_token_loss = model(tokens, position_ids, None, labels)        # [b, s]
    return lm_loss_func(loss_mask, per_token_loss)


# ---- the loop --------------------------------------------------------------------------------
print(f"custom loop: {args.train_iters} steps of {args.global_batch_size} x {args.seq_length} tokens, "
      f"{num_parameters:,} parameters")
start, recent_losses, interval_means = time.perf_counter(), [], []
for step, batch in enumerate(train_loader, start=1):
    loss = optimizer.step(forward_fn, batch["tokens"], batch["position_ids"], batch["labels"],
                          batch["loss_mask"])
    if optimizer.last_updated:                           # a step skipped on fp16 overflow leaves the
        lr_scheduler.step(args.global_batch_size)        # schedule where it is; it counts samples
    recent_losses.append(loss)
    if step % args.log_interval == 0 or step == args.train_iters:
        interval_means.append(float(np.mean(recent_losses)))
        print(f"step {step:5d} | loss {interval_means[-1]:.4f} | lr {lr_scheduler.get_lr():.3e} | "
              f"grad norm {optimizer.last_grad_norm:.3f} | {time.perf_counter() - start:.1f} s", flush=True)
        recent_losses = []
    if step == args.train_iters:
        break

print(f"mean loss: first log interval {interval_means[0]:.4f} -> last log interval {interval_means[-1]:.4f}")
