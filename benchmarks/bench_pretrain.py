#!/usr/bin/env python
"""Pretraining throughput of RapidGPT beside the best plain-MindSpore loop, measured in the same run.

Both sides train the same GPT (4 layers, hidden 256, 4 heads, seq 128, micro batch 8, vocabulary
8000, tied embeddings, dropout 0.1, fp32, AdamW) on the same synthetic token ids, with the same
number of CPU threads:

1. rapidgpt: the real engine path. `parse_args(argv=[...])` -> `RapidGPTEngine(args=args)` ->
   `GPTPretrainer(engine).train()`, the GPTPretrainer of rapidgpt/tasks/pretraining.py with only
   its dataset hook replaced (a map-style dataset of synthetic GPTDataset-like items). Everything
   else is what `rapidgpt --task pretraining` runs: seeded init, data loader threads, the compiled
   step (bias-corrected AdamW, --clip-grad, finite check), the scheduler, Megatron log lines.
   Iteration times are the wall-clock gaps between the engine's log lines (--log-interval 1),
   so the per-iteration Python work of the trainer and the reporter is counted.
2. baseline: a plain GPT written below in MindSpore, trained the way measured on this machine to be the
   fastest: GRAPH_MODE `nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.AdamWeightDecay)`, the
   batch stacked and converted to Tensors in the loop, the loss read back every step.

Variants (--variants): the same RapidGPT run with --fp16, --bf16, --checkpoint-activations (full
recompute) and --recompute-activations (selective), each in its own fresh subprocess in every
round, reported beside RapidGPT fp32 measured in the same run with tokens/s, time to first step
and peak RSS. fp16 exists for Ascend/GPU: on this CPU it is measured, not expected, to be fast;
bf16 is refused by MindSpore's CPU backend's missing kernels, and the table says so.

Each side runs in its own fresh subprocess (GRAPH_MODE is process-global), one after the other,
alternating rapidgpt, baseline, rapidgpt, ... for --repeats rounds; the best round of each side is
reported, with the median of the rounds beside it (all rounds are printed too). Throughput counts
only the --iters iterations after --warmup ones; "first step" is the wall time of iteration 1 (the
compile), "to first step" runs from model construction (rapidgpt: the `train()` call) to the end
of iteration 1. On a shared machine other processes skew the numbers (±10% between quiet runs is
normal here): every run says when others took CPU meanwhile, and --wait-quiet makes the driver
wait for an idle machine before each side.

`--model bert` makes the same comparison for BERT: RapidGPT's BertPretrainer (what `rapidgpt --task
pretraining --tokenizer-type BertWordPieceLowerCase` runs) beside a plain-MindSpore BERT, the
same sizes, on synthetic masked-LM batches (benchmarks/bert_sides.py).

    python benchmarks/bench_pretrain.py [--model gpt|bert] [--iters 20] [--warmup 3] [--repeats 3] [--threads 2]
                                        [--clip-grad 1.0] [--wait-quiet 300]
                                        [--variants fp32,fp16,bf16,recompute-full,recompute-selective]
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
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bert_sides import run_baseline_bert, run_rapidgpt_bert  # noqa: E402

# The model and optimizer settings shared by both sides (RapidGPT's defaults where they exist).
MODEL = dict(num_layers=4, hidden_size=256, num_heads=4, seq_length=128, micro_batch_size=8,
             vocab_size=8000, dropout=0.1, init_std=0.02, layernorm_eps=1e-5)
OPTIM = dict(weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
RESULT_PREFIX = "BENCH_RESULT "
# RapidGPT variants: flags added to the fp32 run.
# fp16 starts from a scale the bench model's gradients fit (from 2^32 its first ~15 steps would be
# skipped overflows, which skip the optimizer and so are cheaper than real steps).
VARIANTS = {"fp32": [], "fp16": ["--fp16", "--initial-loss-scale", "65536"], "bf16": ["--bf16"], "recompute-full": ["--checkpoint-activations"],
            "recompute-selective": ["--recompute-activations"]}


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
              "first_loss": losses[0], "final_loss": losses[-1], "peak_rss_mib": peak_rss_mib()}
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


def run_rapidgpt(opts, model=MODEL, extra_flags=()):
    """RapidGPT's engine on `model` (MODEL's keys) with `extra_flags` (e.g. --fp16); --model bert:
    its BertPretrainer (benchmarks/bert_sides.py)."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.engine import RapidGPTEngine
    from rapidgpt.global_vars import get_logger
    from rapidgpt.tasks.pretraining import GPTPretrainer

    m, o = model, OPTIM
    total = opts.warmup + opts.iters
    argv = ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"],
            "--num-attention-heads", m["num_heads"], "--seq-length", m["seq_length"],
            "--micro-batch-size", m["micro_batch_size"], "--vocab-size", m["vocab_size"],
            "--make-vocab-size-divisible-by", 64,  # 8000 = 125 x 64: no padding, like the baseline
            "--hidden-dropout", m["dropout"], "--attention-dropout", m["dropout"],
            "--init-method-std", m["init_std"], "--layernorm-epsilon", m["layernorm_eps"],
            "--lr", opts.lr, "--lr-decay-style", "constant", "--weight-decay", o["weight_decay"],
            "--clip-grad", opts.clip_grad,
            "--adam-beta1", o["beta1"], "--adam-beta2", o["beta2"], "--adam-eps", o["eps"],
            "--train-iters", total, "--log-interval", 1, "--eval-iters", 0, "--no-progress-bar",
            "--cpu-threads", opts.threads, "--device", "cpu", "--seed", 1234, *extra_flags]
    clock = _IterationClock()
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
        return run_baseline_bert(opts, MODEL, OPTIM, summarize)
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.common.initializer import Normal

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(opts.threads)
    ms.set_seed(1234)
    np.random.seed(1234)
    m, o = MODEL, OPTIM
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
# Driver

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


def run_side(side, opts, variant="fp32"):
    """One side in a fresh process; also measures how much CPU OTHER processes took meanwhile.
    A RapidGPT variant that exits with its one-line error (bf16 on CPU) comes back as
    {"refused": that line}."""
    if opts.wait_quiet:
        wait_until_quiet(opts.wait_quiet)
    child_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy_before, wall_before = busy_seconds(), time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--only", side, "--iters", str(opts.iters),
           "--warmup", str(opts.warmup), "--threads", str(opts.threads), "--lr", str(opts.lr),
           "--clip-grad", str(opts.clip_grad), "--variant", variant, "--model", opts.model]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    child_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - wall_before
    ours = (child_after.ru_utime + child_after.ru_stime) - (child_before.ru_utime + child_before.ru_stime)
    others = max(busy_seconds() - busy_before - ours, 0.0) / wall   # average cores used by others
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    refusals = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("rapidgpt: error:")
                or "ArgumentError: " in line]
    if proc.returncode != 0 and refusals:
        return {"refused": refusals[-1].split("ArgumentError: ")[-1]}
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"the {side} subprocess failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result["other_processes_cores"] = others
    return result


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="measured iterations")
    parser.add_argument("--warmup", type=int, default=3,
                        help="iterations before measuring (the first compiles)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of (rapidgpt, baseline); the best is reported")
    parser.add_argument("--threads", type=int, default=2, help="MindSpore CPU threads on both sides")
    parser.add_argument("--lr", type=float, default=6e-4, help="constant learning rate on both sides")
    parser.add_argument("--clip-grad", type=float, default=1.0,
                        help="rapidgpt's --clip-grad (its default 1.0; the baseline never clips: clipping is one more pass over the gradients, ~3%% of the step here)")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="before each side, wait up to this long for other processes to leave the CPU")
    parser.add_argument("--only", choices=["rapidgpt", "baseline"], default=None,
                        help="run one side in this process and print its JSON result line")
    parser.add_argument("--show-log", action="store_true",
                        help="with --only rapidgpt: keep the engine's log")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"RapidGPT variants to run beside fp32, comma-separated from {', '.join(VARIANTS)}")
    parser.add_argument("--variant", choices=list(VARIANTS), default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=["gpt", "bert"], default="gpt",
                        help="gpt, or bert: RapidGPT's BERT pretraining beside a plain-MindSpore BERT "
                             "(benchmarks/bert_sides.py; the same sizes, synthetic masked-LM batches)")
    opts = parser.parse_args()
    variants = [v for v in opts.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if opts.warmup < 1 or opts.iters < 1:
        parser.error("--warmup and --iters must be >= 1 (iteration 1 compiles and is never measured)")

    if opts.only:
        result = (run_rapidgpt(opts, extra_flags=VARIANTS[opts.variant]) if opts.only == "rapidgpt"
                  else run_baseline(opts))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return

    m = MODEL
    print(f"model: {opts.model.upper()}, {m['num_layers']} layers, hidden {m['hidden_size']}, {m['num_heads']} heads, seq "
          f"{m['seq_length']}, micro batch {m['micro_batch_size']}, vocab {m['vocab_size']}, fp32, "
          f"dropout {m['dropout']}, AdamW lr {opts.lr}; rapidgpt --clip-grad {opts.clip_grad}; "
          f"{opts.threads} CPU threads; {opts.warmup} warm-up + {opts.iters} measured iterations, "
          f"{opts.repeats} round(s)")
    runs = {"rapidgpt": [], "baseline": []}
    others = {v: [] for v in variants if v != "fp32"}
    for round_ in range(1, opts.repeats + 1):
        for side in ("rapidgpt", "baseline"):
            result = run_side(side, opts)
            runs[side].append(result)
            print(f"  round {round_} {side:8s}: {describe(result)}", flush=True)
        for variant in others:
            if others[variant] and "refused" in others[variant][0]:
                continue                          # refused once: the backend will not change
            result = run_side("rapidgpt", opts, variant)
            others[variant].append(result)
            text = f"refused: {result['refused']}" if "refused" in result else describe(result)
            print(f"  round {round_} rapidgpt {variant}: {text}", flush=True)
    best = {side: max(results, key=lambda r: r["tokens_per_s"]) for side, results in runs.items()}
    ours, base = best["rapidgpt"], best["baseline"]
    print(f"best of {opts.repeats} round(s):")
    print(f"rapidgpt: {ours['tokens_per_s']:.1f} tokens/s (first step {ours['first_step_s']:.2f} s, "
          f"to first step {ours['to_first_step_s']:.2f} s; "
          f"loss {ours['first_loss']:.3f} -> {ours['final_loss']:.3f})")
    if opts.model == "bert":
        print("(losses: rapidgpt's is the logged lm loss, the baseline's lm + sop loss)")
    print(f"baseline (GRAPH_MODE TrainOneStepCell): {base['tokens_per_s']:.1f} tokens/s (first step "
          f"{base['first_step_s']:.2f} s, to first step {base['to_first_step_s']:.2f} s; "
          f"loss {base['first_loss']:.3f} -> {base['final_loss']:.3f})")
    ratio = ours["tokens_per_s"] / base["tokens_per_s"]
    print(f"ratio rapidgpt/baseline: {ratio:.3f} (target >= 0.95{'' if ratio >= 0.95 else ': MISSED'})")
    med = {side: statistics.median(r["tokens_per_s"] for r in results) for side, results in runs.items()}
    print(f"median of {opts.repeats} round(s): rapidgpt {med['rapidgpt']:.1f}, "
          f"baseline {med['baseline']:.1f} tokens/s, ratio {med['rapidgpt'] / med['baseline']:.3f}")
    if others:
        print_variants(ours, others)
    every = [r for results in list(runs.values()) + list(others.values()) for r in results]
    busy = [r for r in every if r.get("other_processes_cores", 0.0) > 0.1]
    if busy:
        print(f"note: other processes used CPU during {len(busy)} of {len(every)} runs; "
              f"rerun with --wait-quiet 300 on a shared machine")


def print_variants(fp32, others):
    """The variants' best rounds beside RapidGPT fp32's best, measured in the same run."""
    print("RapidGPT variants (best round each; ratio = tokens/s / RapidGPT fp32's):")
    print(f"  {'variant':20s} {'tokens/s':>9s} {'ratio':>6s} {'to first step':>14s} {'peak RSS':>10s}")
    rows = [("fp32", fp32)] + [(v, max(rs, key=lambda r: r.get("tokens_per_s", 0.0))) for v, rs in others.items()]
    for variant, r in rows:
        if "refused" in r:
            print(f"  {variant:20s} refused on this backend: {r['refused']}")
            continue
        print(f"  {variant:20s} {r['tokens_per_s']:9.1f} {r['tokens_per_s'] / fp32['tokens_per_s']:6.3f} "
              f"{r['to_first_step_s']:12.2f} s {r['peak_rss_mib']:6.0f} MiB")
    fp16 = dict(rows).get("fp16")
    if fp16 is not None and "refused" not in fp16:
        slower = fp16["tokens_per_s"] < fp32["tokens_per_s"]
        print(f"fp16 is {'slower' if slower else 'not slower'} than fp32 on this machine "
              f"({fp16['tokens_per_s']:.1f} vs {fp32['tokens_per_s']:.1f} tokens/s)"
              + ("; 16-bit pays off where its kernels are faster (Ascend/GPU)" if slower else ""))


if __name__ == "__main__":
    main()
