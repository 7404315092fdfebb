#!/usr/bin/env python
"""Pretraining throughput of RapidGPT beside a plain-MindSpore loop and PyTorch eager, measured in the same run.

Every side trains the same GPT (--size bench: 4 layers, hidden 256, 4 heads, seq 128, micro batch
8; --size large: 12 layers, hidden 768, 12 heads, seq 512, micro batch 4; vocabulary 8000, tied
embeddings, dropout 0.1, fp32, AdamW) on the same synthetic token ids, with the same number of
CPU threads:

1. rapidgpt: the real engine path. `parse_args(argv=[...])` -> `RapidGPTEngine(args=args)` ->
   `GPTPretrainer(engine).train()`, the GPTPretrainer of rapidgpt/tasks/pretraining.py with only
   its dataset hook replaced (a map-style dataset of synthetic GPTDataset-like items). Everything
   else is what `rapidgpt --task pretraining` runs: seeded init, data loader threads, the compiled
   step with graph kernel fusion where available (bias-corrected AdamW, --clip-grad, finite
   check), the scheduler, Megatron log lines. Iteration times are the wall-clock gaps between the
   engine's log lines (--log-interval 1), so the trainer's per-iteration Python work is counted.
2. baseline (plain MindSpore): a plain GPT written below in MindSpore, trained the way measured on
   this machine to be the fastest plain loop: GRAPH_MODE `nn.TrainOneStepCell(nn.WithLossCell(net,
   loss), nn.AdamWeightDecay)`, the batch stacked and converted to Tensors in the loop.
3. pytorch (when torch is installed, `pip install torch==2.13.0`; a benchmark extra): the same GPT
   in PyTorch eager (benchmarks/torch_side.py), from RapidGPT's initial weights, with
   torch.optim.AdamW and clip_grad_norm_. Before the rounds, a dropout-free "same model" check
   prints RapidGPT's (fused and unfused) and PyTorch's first losses side by side.

MFU: Megatron's model FLOPs per iteration / the fp32 GEMM peak measured in the same run (2048^3
products in a compiled MindSpore graph and in torch.mm; the higher one). The profile (skip it
with --no-profile) is one more RapidGPT run under MindSpore's profiler: where a step's time goes,
by kernel category, with the host loop and the data (benchmarks/step_profile.py).

Variants (--variants): the same RapidGPT run unfused (--graph-kernel-fusion off), with --fp16,
--bf16, --checkpoint-activations (full recompute) and --recompute-activations (selective), each
in its own fresh subprocess in every round, reported beside RapidGPT fp32 measured in the same
run with tokens/s, time to first step and peak RSS. fp16 exists for Ascend/GPU: on this CPU it is
measured, not expected, to be fast; bf16 on the CPU is emulated (fp32 tensors holding bf16 values,
rapidgpt/emulated_bf16.py), so it costs fp32's kernels plus its roundings, unfused.

First and second start: every RapidGPT run above compiles its step (`--compile-cache off`: what a
first start of a run does). The second-start variant is the fp32 run with the compile cache on
(rapidgpt/config/compile_cache.py), started twice in round 1 (the first start fills the cache,
unless an earlier benchmark did) and once in later rounds: its time to first step is a second start
of the same run, a resume say, and the summary gives it as a multiple of the plain loop's first
step (that loop has no cache).

Each side runs in its own fresh subprocess (GRAPH_MODE is process-global), one after the other,
alternating for --repeats rounds; the best round of each side is reported, with the median of the
rounds beside it (all rounds are printed too). Throughput counts only the --iters iterations after
--warmup ones; "first step" is the wall time of iteration 1 (the compile), "to first step" runs
from model construction (rapidgpt: the `train()` call) to the end of iteration 1. On a shared
machine other processes skew the numbers (±10% between quiet runs is normal here): every run says
when others took CPU meanwhile, and --wait-quiet makes the driver wait for an idle machine before
each side. The last two lines are `ratio rapidgpt/pytorch-eager: X` and
`ratio rapidgpt/plain-mindspore: Y`.

`--model bert` makes the same comparison for BERT: RapidGPT's BertPretrainer (what `rapidgpt --task
pretraining --tokenizer-type BertWordPieceLowerCase` runs) beside a plain-MindSpore BERT, the
same sizes, on synthetic masked-LM batches (benchmarks/bert_sides.py); there is no PyTorch side.
`--model llama` compares the bench sizes as a Llama-style decoder (RoPE, RMSNorm, SwiGLU, 2 query
heads per key/value head, no biases, untied output layer, no dropout): RapidGPT's built-in decoder
with those flags, a plain-MindSpore Llama and a PyTorch eager Llama started from RapidGPT's initial
weights (benchmarks/llama_sides.py), with the same-model check.

Every ratio line ends with the CPU it was measured on and that CPU's fp32 GEMM peak measured in the
same run (machines differ, e.g. with or without AVX-512).

    python benchmarks/bench_pretrain.py [--size bench|large] [--model gpt|bert|llama] [--iters 20] [--warmup 3]
                                        [--repeats 3] [--threads 2] [--clip-grad 1.0] [--wait-quiet 300]
                                        [--variants fp32,unfused,fp16,bf16,recompute-full,recompute-selective,
                                                    second-start]
                                        [--no-profile]
"""
import argparse
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bert_sides import run_baseline_bert, run_rapidgpt_bert  # noqa: E402
from llama_sides import llama_dims, llama_flags  # noqa: E402

# The model and optimizer settings shared by every side (RapidGPT's defaults where they exist):
# the bench model, and a larger one (--size large, GPT-2 small's layers at seq 512).
MODELS = {
    "bench": dict(num_layers=4, hidden_size=256, num_heads=4, seq_length=128, micro_batch_size=8,
                  vocab_size=8000, dropout=0.1, init_std=0.02, layernorm_eps=1e-5),
    "large": dict(num_layers=12, hidden_size=768, num_heads=12, seq_length=512, micro_batch_size=4,
                  vocab_size=8000, dropout=0.1, init_std=0.02, layernorm_eps=1e-5),
}
OPTIM = dict(weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
RESULT_PREFIX = "BENCH_RESULT "
# RapidGPT variants: flags added to the fp32 run.
# fp16 starts from a scale the bench model's gradients fit (from 2^32 its first ~15 steps would be
# skipped overflows, which skip the optimizer and so are cheaper than real steps).
VARIANTS = {"fp32": [], "unfused": ["--graph-kernel-fusion", "off"],
            "fp16": ["--fp16", "--initial-loss-scale", "65536"], "bf16": ["--bf16"],
            "recompute-full": ["--checkpoint-activations"], "recompute-selective": ["--recompute-activations"],
            "second-start": ["--compile-cache", "on"]}


def peak_rss_mib():
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------------
# Synthetic data (shared)

class SyntheticGPTDataset:
    """`num_samples` items shaped like rapidgpt/data/gpt_dataset.py's GPTDataset items.

    Token ids follow a Zipf-like unigram distribution (so the loss has something to learn and
    visibly falls from ln(vocab)); all samples are drawn once, up front.
    """

    def __init__(self, num_samples, seq_length, vocab_size, seed=1234):
        rng = np.random.default_rng(seed)
        p = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
        self.samples = rng.choice(vocab_size, size=(num_samples, seq_length + 1),
                                  p=p / p.sum()).astype(np.int32)
        self.loss_mask = np.ones(seq_length, np.float32)
        self.position_ids = np.arange(seq_length, dtype=np.int32)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        sample = self.samples[idx]
        return {"tokens": sample[:-1], "labels": sample[1:], "loss_mask": self.loss_mask.copy(),
                "position_ids": self.position_ids.copy()}


def summarize(side, end_times, losses, start, first_step, tokens_per_iter, warmup, iters, extra=None):
    """end_times[i]: perf_counter at the end of iteration i+1; start: model construction began;
    first_step: seconds of iteration 1 (data + compile + run)."""
    measured = end_times[warmup + iters - 1] - end_times[warmup - 1]
    per_iter = [b - a for a, b in zip(end_times[warmup - 1:], end_times[warmup:warmup + iters])]
    result = {"side": side, "tokens_per_s": iters * tokens_per_iter / measured,
              "s_per_iter": measured / iters, "median_s_per_iter": statistics.median(per_iter),
              "first_step_s": first_step, "to_first_step_s": end_times[0] - start,
              "first_loss": losses[0], "final_loss": losses[-1], "losses": [float(x) for x in losses],
              "peak_rss_mib": peak_rss_mib()}
    result.update(extra or {})
    return result


# ---------------------------------------------------------------------------------------------
# Side 1: RapidGPT through its engine

class _IterationClock(logging.Handler):
    """Records the wall time, iteration, reported ms and loss of every Megatron training line."""
    LINE = re.compile(r"iteration\s+(\d+)/.*elapsed time per iteration \(ms\): ([\d.]+)"
                      r"(?:.*lm loss: ([\dE+.-]+))?")      # no loss on a skipped (overflow) step

    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        now = time.perf_counter()
        match = self.LINE.search(record.getMessage())
        if match:
            self.records.append((now, int(match[1]), float(match[2]),
                                 float(match[3]) if match[3] else float("nan")))


def engine_argv(opts, m, extra_flags=()):
    """The rapidgpt flags of the bench run of model `m` (a MODELS entry)."""
    o = OPTIM
    return ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"],
            "--num-attention-heads", m["num_heads"], "--seq-length", m["seq_length"],
            "--micro-batch-size", m["micro_batch_size"], "--vocab-size", m["vocab_size"],
            "--make-vocab-size-divisible-by", 64,  # 8000 = 125 x 64: no padding, like the other sides
            "--hidden-dropout", m["dropout"], "--attention-dropout", m["dropout"],
            "--init-method-std", m["init_std"], "--layernorm-epsilon", m["layernorm_eps"],
            "--lr", opts.lr, "--lr-decay-style", "constant", "--weight-decay", o["weight_decay"],
            "--clip-grad", opts.clip_grad,
            "--adam-beta1", o["beta1"], "--adam-beta2", o["beta2"], "--adam-eps", o["eps"],
            "--train-iters", opts.warmup + opts.iters, "--log-interval", 1, "--eval-iters", 0,
            "--no-progress-bar", "--cpu-threads", opts.threads, "--device", "cpu", "--seed", 1234,
            # Every start measured compiles its step, as a first start does; the second-start
            # variant turns the compile cache back on (the later flag wins).
            "--compile-cache", "off", *(llama_flags(m) if opts.model == "llama" else ()), *extra_flags]


def run_rapidgpt(opts, extra_flags=(), clock=None):
    """RapidGPT's engine on the bench model with `extra_flags` (e.g. --fp16); --model bert: its
    BertPretrainer (benchmarks/bert_sides.py). `clock`: an _IterationClock (subclass) to use."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.engine import RapidGPTEngine
    from rapidgpt.global_vars import get_logger
    from rapidgpt.tasks.pretraining import GPTPretrainer

    m, o = opts.dims, OPTIM
    total = opts.warmup + opts.iters
    argv = engine_argv(opts, m, extra_flags)
    clock = clock or _IterationClock()
    if opts.model == "bert":
        start = run_rapidgpt_bert(opts, m, o, argv, clock, summarize, opts.show_log)
    else:
        args = parse_args(argv=[str(a) for a in argv])
        engine = RapidGPTEngine(args=args)

        class SyntheticGPTPretrainer(GPTPretrainer):
            def train_valid_test_datasets_provider(self, train_val_test_num_samples):
                train = SyntheticGPTDataset(train_val_test_num_samples[0], args.seq_length, args.vocab_size)
                return train, None, None

        logger = get_logger()
        if not opts.show_log:
            logger.handlers.clear()   # keep the console for the benchmark's own lines
        logger.addHandler(clock)
        trainer = SyntheticGPTPretrainer(engine)
        start = time.perf_counter()
        trainer.train()
    records = clock.records
    assert [r[1] for r in records] == list(range(1, total + 1)), records
    reported = [r[2] / 1000.0 for r in records[opts.warmup:]]
    return summarize("rapidgpt", [r[0] for r in records], [r[3] for r in records], start,
                     records[0][2] / 1000.0, m["micro_batch_size"] * m["seq_length"], opts.warmup,
                     opts.iters, {"engine_reported_s_per_iter": sum(reported) / len(reported)})


# ---------------------------------------------------------------------------------------------
# Side 2: the plain MindSpore baseline

def run_baseline(opts):
    if opts.model == "bert":
        return run_baseline_bert(opts, opts.dims, OPTIM, summarize)
    if opts.model == "llama":
        from llama_sides import run_baseline_llama
        m = opts.dims
        return run_baseline_llama(opts, m, OPTIM, SyntheticGPTDataset((opts.warmup + opts.iters) * m["micro_batch_size"],
                                                                      m["seq_length"], m["vocab_size"]), summarize)
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.common.initializer import Normal

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(opts.threads)
    ms.set_seed(1234)
    np.random.seed(1234)
    m, o = opts.dims, OPTIM
    h, heads, s, v, p = m["hidden_size"], m["num_heads"], m["seq_length"], m["vocab_size"], m["dropout"]

    def dense(n_in, n_out, std=m["init_std"]):
        return nn.Dense(n_in, n_out, weight_init=Normal(std), bias_init="zeros")

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.qkv = dense(h, 3 * h)
            self.proj = dense(h, h, m["init_std"] / (2 * m["num_layers"]) ** 0.5)
            self.dropout = nn.Dropout(p=p)
            self.bmm_qk = ops.BatchMatMul(transpose_b=True)
            self.bmm_pv = ops.BatchMatMul()
            self.scale = (h // heads) ** -0.5
            self.mask = Tensor(np.triu(np.full((1, 1, s, s), -10000.0, np.float32), k=1))

        def construct(self, x):
            b = x.shape[0]
            # [b, s, 3h] -> [3, b, heads, s, head_dim]
            qkv = self.qkv(x).reshape(b, s, 3, heads, h // heads).transpose(2, 0, 3, 1, 4)
            q, k, val = qkv[0], qkv[1], qkv[2]
            scores = self.bmm_qk(q, k) * self.scale + self.mask
            probs = self.dropout(ops.softmax(scores, axis=-1))
            context = self.bmm_pv(probs, val).transpose(0, 2, 1, 3).reshape(b, s, h)
            return self.proj(context)

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm((h,), epsilon=m["layernorm_eps"])
            self.attn = Attention()
            self.ln2 = nn.LayerNorm((h,), epsilon=m["layernorm_eps"])
            self.fc1 = dense(h, 4 * h)
            self.gelu = nn.GELU(approximate=True)   # tanh approximation
            self.fc2 = dense(4 * h, h, m["init_std"] / (2 * m["num_layers"]) ** 0.5)
            self.drop1 = nn.Dropout(p=p)
            self.drop2 = nn.Dropout(p=p)

        def construct(self, x):
            x = x + self.drop1(self.attn(self.ln1(x)))
            return x + self.drop2(self.fc2(self.gelu(self.fc1(self.ln2(x)))))

    class GPT(nn.Cell):
        """Pre-LN GPT, learned positions, tied input/output embeddings; returns logits [b*s, v]."""

        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(v, h, embedding_table=Normal(m["init_std"]))
            self.wpe = nn.Embedding(s, h, embedding_table=Normal(m["init_std"]))
            self.positions = Tensor(np.arange(s, dtype=np.int32)[None])
            self.drop = nn.Dropout(p=p)
            self.blocks = nn.CellList([Block() for _ in range(m["num_layers"])])
            self.ln_f = nn.LayerNorm((h,), epsilon=m["layernorm_eps"])
            self.logits = ops.MatMul(transpose_b=True)

        def construct(self, tokens):
            x = self.drop(self.wte(tokens) + self.wpe(self.positions))
            for block in self.blocks:
                x = block(x)
            return self.logits(self.ln_f(x).reshape(-1, h), self.wte.embedding_table)

    class LMLoss(nn.Cell):
        def construct(self, logits, labels):
            return ops.cross_entropy(logits, labels.reshape(-1))   # mean over tokens

    start = time.perf_counter()
    net = GPT()
    params = net.trainable_params()
    decay = [q for q in params if q.ndim > 1 and not q.name.endswith("bias")]   # Megatron's groups
    no_decay = [q for q in params if not (q.ndim > 1 and not q.name.endswith("bias"))]
    optimizer = nn.AdamWeightDecay([{"params": decay, "weight_decay": o["weight_decay"]},
                                    {"params": no_decay, "weight_decay": 0.0}],
                                   learning_rate=opts.lr, beta1=o["beta1"], beta2=o["beta2"], eps=o["eps"])
    train_net = nn.TrainOneStepCell(nn.WithLossCell(net, LMLoss()), optimizer)
    train_net.set_train(True)

    total = opts.warmup + opts.iters
    mbs = m["micro_batch_size"]
    dataset = SyntheticGPTDataset(total * mbs, s, v)
    end_times, losses = [], []
    iter1_start = None
    for it in range(total):
        if it == 0:
            iter1_start = time.perf_counter()
        items = [dataset[i] for i in range(it * mbs, (it + 1) * mbs)]
        tokens = Tensor(np.stack([x["tokens"] for x in items]))
        labels = Tensor(np.stack([x["labels"] for x in items]))
        loss = train_net(tokens, labels)
        losses.append(float(loss.asnumpy()))
        end_times.append(time.perf_counter())
    return summarize("baseline", end_times, losses, start, end_times[0] - iter1_start, mbs * s,
                     opts.warmup, opts.iters)


# ---------------------------------------------------------------------------------------------
# Running a side in a fresh process

def busy_seconds():
    """CPU seconds the whole machine has spent busy (non-idle, non-iowait), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_until_quiet(max_wait, threshold=0.1, window=2.0):
    """Wait (up to max_wait s) for a `window` in which other processes use < threshold cores."""
    deadline = time.perf_counter() + max_wait
    while True:
        before = busy_seconds()
        time.sleep(window)
        load = (busy_seconds() - before) / window
        if load < threshold or time.perf_counter() >= deadline:
            return load


def run_side(side, opts, variant="fp32", extra=()):
    """One side (or job: init-weights, gemm-peak, profile) in a fresh process; also measures how
    much CPU OTHER processes took meanwhile."""
    if opts.wait_quiet:
        wait_until_quiet(opts.wait_quiet)
    child_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before, wall_before = busy_seconds(), time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--only", side, "--iters", str(opts.iters),
           "--warmup", str(opts.warmup), "--threads", str(opts.threads), "--lr", str(opts.lr),
           "--clip-grad", str(opts.clip_grad), "--variant", variant, "--model", opts.model,
           "--size", opts.size, "--weights", opts.weights or "", "--dropout", str(opts.dims["dropout"]),
           *map(str, extra)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    child_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - wall_before
    ours = (child_after.ru_utime + child_after.ru_stime) - (child_before.ru_utime + child_before.ru_stime)
    others = max(busy_seconds() - busy_before - ours, 0.0) / wall   # average cores used by others
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"the {side} subprocess failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    if isinstance(result, dict):
        result["other_processes_cores"] = others
    return result


# ---------------------------------------------------------------------------------------------
# Model FLOPs and the machine's GEMM peak (MFU)

def model_flops_per_iteration(opts):
    """Megatron's count of a training iteration's FLOPs (forward + backward, matrix products only,
    no recompute) for the bench run's flags (rapidgpt/theoretical_memory.py's training_flops: GPT-2's
    72 B s L h^2 (1 + s / (6h)) + 6 B s h V; GQA and SwiGLU for the Llama)."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.theoretical_memory import shape_from_args, training_flops
    args = parse_args(argv=[str(a) for a in engine_argv(opts, opts.dims)])
    return training_flops(shape_from_args(args, args.vocab_size), opts.dims["micro_batch_size"])


def cpu_name():
    """The CPU's model name and whether it has AVX-512 (/proc/cpuinfo)."""
    name, flags = "unknown CPU", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name == "unknown CPU":
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value
    except OSError:
        pass
    return f"{name}, {'with' if 'avx512f' in flags.split() else 'without'} AVX-512"


def gemm_peak_mindspore(threads, n=2048, chain=4, repeats=5):
    """GFLOP/s of fp32 n x n matrix products inside a compiled MindSpore graph (oneDNN)."""
    import mindspore as ms
    from mindspore import Tensor, ops

    ms.set_device("CPU")
    ms.device_context.cpu.op_tuning.threads_num(threads)
    matmul = ops.MatMul()

    @ms.jit
    def products(a, b):
        for _ in range(chain):
            a = matmul(a, b)
        return a.sum()

    rng = np.random.default_rng(0)
    a = Tensor(rng.standard_normal((n, n), dtype=np.float32))
    b = Tensor((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32))
    products(a, b).asnumpy()                                      # compile
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        products(a, b).asnumpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 * chain / best / 1e9


def gemm_peak_torch(threads, n=2048, chain=4, repeats=5):
    """GFLOP/s of fp32 n x n torch.mm (PyTorch's CPU BLAS)."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n) / n ** 0.5
    best = float("inf")
    for i in range(repeats + 1):
        start = time.perf_counter()
        c = a
        for _ in range(chain):
            c = c @ b
        float(c.sum())
        if i:                                                     # the first call warms up
            best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 * chain / best / 1e9


def torch_available():
    import importlib.util
    return importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------------------------------------------
# Output

def describe(r):
    text = (f"{r['tokens_per_s']:8.1f} tokens/s  ({r['s_per_iter'] * 1000:.0f} ms/iter, median "
            f"{r['median_s_per_iter'] * 1000:.0f})  first step {r['first_step_s']:.2f} s, to first step "
            f"{r['to_first_step_s']:.2f} s  loss {r['first_loss']:.3f} -> {r['final_loss']:.3f}  "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB")
    if "engine_reported_s_per_iter" in r:
        text += f"  [engine's own timer: {r['engine_reported_s_per_iter'] * 1000:.0f} ms/iter]"
    if r.get("other_processes_cores", 0.0) > 0.1:
        text += f"  WARNING: other processes used {r['other_processes_cores']:.2f} cores meanwhile"
    return text


SIDE_NAMES = {"rapidgpt": "rapidgpt", "baseline": "plain MindSpore (GRAPH_MODE TrainOneStepCell)",
              "pytorch": "PyTorch eager"}


def print_summary(opts, runs, peak, second_starts=()):
    """Best round of each side with its MFU, the times to the first step; the ratio lines come last."""
    flops = model_flops_per_iteration(opts) if opts.model != "bert" else float("nan")
    machine = f"on {cpu_name()}, fp32 GEMM peak {peak:.0f} GFLOP/s measured in this run"
    tokens_per_iter = opts.dims["micro_batch_size"] * opts.dims["seq_length"]
    best = {side: max(results, key=lambda r: r["tokens_per_s"]) for side, results in runs.items() if results}
    med = {side: statistics.median(r["tokens_per_s"] for r in results) for side, results in runs.items() if results}
    print(f"best of {opts.repeats} round(s) (median of the rounds in brackets); MFU = model FLOPs "
          f"(Megatron's count, {flops / 1e9:.1f} GFLOP/iteration) / the GEMM peak, {peak:.0f} GFLOP/s:")
    for side, r in best.items():
        mfu = flops * r["tokens_per_s"] / tokens_per_iter / (peak * 1e9)
        print(f"  {SIDE_NAMES[side]:46s} {r['tokens_per_s']:8.1f} tokens/s [{med[side]:8.1f}]  MFU {mfu:6.1%}  "
              f"to first step {r['to_first_step_s']:6.2f} s  peak RSS {r['peak_rss_mib']:5.0f} MiB  "
              f"loss {r['first_loss']:.3f} -> {r['final_loss']:.3f}")
    if opts.model == "bert":
        print("(losses: rapidgpt's is the logged lm loss, the baseline's lm + sop loss)")
    ours = best["rapidgpt"]["tokens_per_s"]
    if "pytorch" in best:
        ratio = ours / best["pytorch"]["tokens_per_s"]
        print(f"ratio rapidgpt/pytorch-eager: {ratio:.3f} (median {med['rapidgpt'] / med['pytorch']:.3f}; "
              f"target >= 1.0{'' if ratio >= 1.0 else ': MISSED'}) {machine}")
    else:
        print("ratio rapidgpt/pytorch-eager: not measured (torch is not installed: "
              "pip install torch==2.13.0, a benchmark extra)" if opts.model != "bert" else
              "ratio rapidgpt/pytorch-eager: not measured (the PyTorch sides are the GPT's and the Llama's)")
    first = {side: min(r["to_first_step_s"] for r in results) for side, results in runs.items() if results}
    print(f"time to first step (best round): rapidgpt {first['rapidgpt']:.2f} s, plain MindSpore "
          f"{first['baseline']:.2f} s: {first['rapidgpt'] / first['baseline']:.2f}x plain")
    second = [r for r in second_starts if "to_first_step_s" in r]
    if second:
        fastest = min(r["to_first_step_s"] for r in second)
        print(f"second start (the same run again, its step loaded from the compile cache): {fastest:.2f} s to "
              f"first step: {fastest / first['baseline']:.2f}x plain")
    ratio = ours / best["baseline"]["tokens_per_s"]
    print(f"ratio rapidgpt/plain-mindspore: {ratio:.3f} (median {med['rapidgpt'] / med['baseline']:.3f}; "
          f"target >= 1.3{'' if ratio >= 1.3 else ': MISSED'}) {machine}")


def print_variants(fp32, others):
    """The variants' best rounds beside RapidGPT fp32's best, measured in the same run."""
    print("RapidGPT variants (best round each; ratio = tokens/s / RapidGPT fp32's):")
    print(f"  {'variant':20s} {'tokens/s':>9s} {'ratio':>6s} {'to first step':>14s} {'peak RSS':>10s}")
    rows = [("fp32", fp32)] + [(v, max(rs, key=lambda r: r.get("tokens_per_s", 0.0))) for v, rs in others.items()]
    for variant, r in rows:
        print(f"  {variant:20s} {r['tokens_per_s']:9.1f} {r['tokens_per_s'] / fp32['tokens_per_s']:6.3f} "
              f"{r['to_first_step_s']:12.2f} s {r['peak_rss_mib']:6.0f} MiB")
    fp16 = dict(rows).get("fp16")
    if fp16 is not None:
        slower = fp16["tokens_per_s"] < fp32["tokens_per_s"]
        print(f"fp16 is {'slower' if slower else 'not slower'} than fp32 on this machine "
              f"({fp16['tokens_per_s']:.1f} vs {fp32['tokens_per_s']:.1f} tokens/s)"
              + ("; 16-bit pays off where its kernels are faster (Ascend/GPU)" if slower else ""))


def same_model_check(opts):
    """RapidGPT (fused, and with --graph-kernel-fusion off) and PyTorch from the same weights on the
    same data without dropout: their losses must agree (the sides are one model, one optimizer);
    the fused-unfused difference is what graph kernel fusion changes in the numbers."""
    short = argparse.Namespace(**{**vars(opts), "iters": 3, "warmup": 1, "wait_quiet": 0.0})
    runs = {"rapidgpt": run_side("rapidgpt", short, extra=["--dropout", "0"])["losses"],
            "rapidgpt unfused": run_side("rapidgpt", short, "unfused", extra=["--dropout", "0"])["losses"],
            "pytorch": run_side("pytorch", short, extra=["--dropout", "0"])["losses"]}
    print(f"same model: without dropout, from RapidGPT's initial weights, the losses of {len(runs['pytorch'])} "
          f"iterations:")
    for side, losses in runs.items():
        print(f"  {side:17s} " + " ".join(f"{x:.6f}" for x in losses))
    for a, b in (("rapidgpt", "pytorch"), ("rapidgpt unfused", "pytorch"), ("rapidgpt", "rapidgpt unfused")):
        diff = max(abs(x - y) for x, y in zip(runs[a], runs[b]))
        print(f"  max |{a} - {b}|: {diff:.2e}" + ("" if diff < 1e-3 else "  MISMATCH: not the same model"))


# ---------------------------------------------------------------------------------------------
# Driver

def only(opts):
    """--only: one side or job in this process; its JSON result on one line."""
    # The variant's flags where `import rapidgpt` looks for them, as on a user's command line (with
    # --graph-kernel-fusion off it leaves OpenMP's wait policy alone, rapidgpt/config/kernel_fusion.py).
    sys.argv[1:] = [str(flag) for flag in VARIANTS[opts.variant]]
    if opts.only == "rapidgpt":
        result = run_rapidgpt(opts, VARIANTS[opts.variant])
    elif opts.only == "baseline":
        result = run_baseline(opts)
    elif opts.only == "pytorch":
        from llama_sides import run_torch_llama
        from torch_side import run_torch
        result = (run_torch_llama if opts.model == "llama" else run_torch)(
            opts, opts.dims, OPTIM, opts.weights,
            SyntheticGPTDataset((opts.warmup + opts.iters) * opts.dims["micro_batch_size"],
                                opts.dims["seq_length"], opts.dims["vocab_size"]), summarize)
    elif opts.only == "init-weights":
        from llama_sides import write_initial_llama_weights
        from torch_side import write_initial_weights
        (write_initial_llama_weights if opts.model == "llama" else write_initial_weights)(
            opts.weights, engine_argv(opts, opts.dims))
        result = {}
    elif opts.only == "gemm-peak":
        result = {"mindspore": gemm_peak_mindspore(opts.threads)}
    elif opts.only == "gemm-peak-torch":
        result = {"pytorch": gemm_peak_torch(opts.threads)}
    else:
        from step_profile import run_profile
        result = run_profile(opts, sys.modules[__name__])
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=list(MODELS), default="bench",
                        help="bench: 4 layers, hidden 256, seq 128, micro batch 8; large: 12 layers, hidden "
                             "768, seq 512, micro batch 4 (vocabulary 8000 in both)")
    parser.add_argument("--iters", type=int, default=20, help="measured iterations")
    parser.add_argument("--warmup", type=int, default=3,
                        help="iterations before measuring (the first compiles)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of (rapidgpt, plain MindSpore, PyTorch); the best is reported")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads on every side")
    parser.add_argument("--lr", type=float, default=6e-4, help="constant learning rate on every side")
    parser.add_argument("--clip-grad", type=float, default=1.0,
                        help="rapidgpt's and PyTorch's clipping by the global norm (rapidgpt's default 1.0; the "
                             "plain-MindSpore loop never clips: one more pass over the gradients, ~3%% of its step)")
    parser.add_argument("--dropout", type=float, default=None,
                        help="dropout on every side (default the model's 0.1)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each side, wait up to this long for other processes to leave the CPU")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the profiled RapidGPT run (where a step's time goes)")
    parser.add_argument("--only", choices=["rapidgpt", "baseline", "pytorch", "init-weights", "gemm-peak",
                                           "gemm-peak-torch", "profile"], default=None,
                        help="run one side (or job) in this process and print its JSON result line")
    parser.add_argument("--weights", default="", help=argparse.SUPPRESS)   # init-weights' file for pytorch
    parser.add_argument("--show-log", action="store_true",
                        help="with --only rapidgpt: keep the engine's log")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"RapidGPT variants to run beside fp32, comma-separated from {', '.join(VARIANTS)}")
    parser.add_argument("--variant", choices=list(VARIANTS), default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=["gpt", "bert", "llama"], default="gpt",
                        help="gpt; bert: RapidGPT's BERT pretraining beside a plain-MindSpore BERT "
                             "(benchmarks/bert_sides.py; the same sizes, synthetic masked-LM batches; no PyTorch "
                             "side); llama: the sizes as a Llama-style decoder on all three sides "
                             "(benchmarks/llama_sides.py)")
    opts = parser.parse_args()
    opts.dims = llama_dims(MODELS[opts.size]) if opts.model == "llama" else dict(MODELS[opts.size])
    if opts.dropout is not None:
        opts.dims["dropout"] = opts.dropout
    variants = [v for v in opts.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if opts.warmup < 1 or opts.iters < 1:
        parser.error("--warmup and --iters must be >= 1 (iteration 1 compiles and is never measured)")
    if opts.only:
        return only(opts)

    m = opts.dims
    with_torch = opts.model in ("gpt", "llama") and torch_available()
    print(f"model: {opts.model.upper()} ({opts.size}), {m['num_layers']} layers, hidden {m['hidden_size']}, "
          f"{m['num_heads']} heads, seq {m['seq_length']}, micro batch {m['micro_batch_size']}, vocab "
          f"{m['vocab_size']}, fp32, dropout {m['dropout']}, AdamW lr {opts.lr}, --clip-grad {opts.clip_grad} "
          f"(not in the plain-MindSpore loop); {opts.threads} CPU threads; {opts.warmup} warm-up + {opts.iters} "
          f"measured iterations, {opts.repeats} round(s), sides in fresh processes, alternating")
    peaks = run_side("gemm-peak", opts)
    if with_torch:
        peaks.update(run_side("gemm-peak-torch", opts))
    peak = max(v for k, v in peaks.items() if k in ("mindspore", "pytorch"))
    print(f"CPU: {cpu_name()}; fp32 GEMM peak (2048^3, best of 5): " + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()
                                                            if k in ("mindspore", "pytorch")))
    sides = ["rapidgpt", "baseline"] + (["pytorch"] if with_torch else [])
    with tempfile.TemporaryDirectory() as tmp:
        if with_torch:
            opts.weights = os.path.join(tmp, "initial_weights.npz")
            run_side("init-weights", opts)
            same_model_check(opts)
        runs = {side: [] for side in sides}
        others = {v: [] for v in variants if v != "fp32"}
        for round_ in range(1, opts.repeats + 1):
            for side in sides:
                result = run_side(side, opts)
                runs[side].append(result)
                print(f"  round {round_} {side:8s}: {describe(result)}", flush=True)
            for variant in others:
                if variant == "second-start" and round_ == 1:
                    result = run_side("rapidgpt", opts, variant)
                    print(f"  round 1 rapidgpt second-start, the run before (it compiled, or found the step "
                          f"cached by an earlier benchmark): {describe(result)}", flush=True)
                result = run_side("rapidgpt", opts, variant)
                others[variant].append(result)
                print(f"  round {round_} rapidgpt {variant}: {describe(result)}", flush=True)
    if not opts.no_profile and opts.model == "gpt":
        from step_profile import print_profile
        unprofiled = min((r["median_s_per_iter"] * 1000.0 for r in runs.get("rapidgpt", [])), default=None)
        print_profile(run_side("profile", opts), unprofiled)
    if others:
        print_variants(max(runs["rapidgpt"], key=lambda r: r["tokens_per_s"]), others)
    every = [r for results in list(runs.values()) + list(others.values()) for r in results]
    busy = [r for r in every if r.get("other_processes_cores", 0.0) > 0.1]
    if busy:
        print(f"note: other processes used CPU during {len(busy)} of {len(every)} runs; "
              f"rerun with --wait-quiet 300 on a shared machine")
    print_summary(opts, runs, peak, others.get("second-start", ()))


if __name__ == "__main__":
    main()
