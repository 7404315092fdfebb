#!/usr/bin/env python
"""Where the first step's compile time goes: one factor at a time, each in a fresh process.

    python benchmarks/compile_profile.py [--size tiny|bench|large] [--repeats 1]

Each run is `rapidgpt --task pretraining` on the demo corpus with --log-interval 1. Its compile
cost is the wall time of iteration 1 minus the median time of the iterations after it (iteration 1
compiles the step graph, then runs it once). The base run is the model of --size with one
micro-batch per step, dropout 0.1, graph kernel fusion on with a warm kernel cache; every other
row changes one thing, and its difference to the base is that factor's share:

    layers x2              the decoder's layers doubled: compile cost per inlined layer
    micro-batches x4       four micro-batches per step (global batch x4): cost per unrolled micro-batch
    no dropout             --hidden-dropout 0 --attention-dropout 0: the dropout-mask graphs
    unfused                --graph-kernel-fusion off: the fusion passes (kernels already cached)
    cold kernel cache      an empty MS_COMPILER_CACHE_PATH: building the fused kernels (AKG + g++)
    pipeline stage (PP=2)  2 processes, --pipeline-model-parallel-size 2: rank 0's stage (half the
                           layers, compiled piecewise), against the base's whole model
    model graph only       not a training run: the base model (built and transformed as the engine
                           does) with its forward and backward of one micro-batch compiled alone
                           (mindspore.jit over value_and_grad), no schedule or optimizer wrapper; its
                           difference to the base is what the rest of the step graph costs (the
                           schedule's bookkeeping, gradient norm, clipping, overflow check, update)

The machine's CPU and its cores are printed first; figures vary with the host's load (the median
of --repeats rounds is printed).
"""
import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {
    "tiny": dict(layers=2, hidden=64, heads=2, seq=32, micro=2),
    "bench": dict(layers=4, hidden=256, heads=4, seq=128, micro=8),
    "large": dict(layers=12, hidden=768, heads=12, seq=512, micro=4),
}
ITERATION = re.compile(r" iteration\s+(\d+)/.*?elapsed time per iteration \(ms\): ([\d.]+)")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def command(size, layers_factor=1, micro_batches=1, extra=()):
    s = SIZES[size]
    return [sys.executable, "-m", "rapidgpt.cli", "--task", "pretraining",
            "--num-layers", str(s["layers"] * layers_factor), "--hidden-size", str(s["hidden"]),
            "--num-attention-heads", str(s["heads"]), "--seq-length", str(s["seq"]),
            "--micro-batch-size", str(s["micro"]), "--global-batch-size", str(s["micro"] * micro_batches),
            "--train-iters", "5", "--log-interval", "1", "--eval-iters", "0", "--eval-interval", "1000",
            "--no-progress-bar", "--max-new-tokens", "0", "--lr", "1e-4",
            "--compile-cache", "off", *extra]       # every row compiles (none loads a cached step)


def model_graph_seconds(size):
    """(compile seconds, steady seconds) of the base model's forward and backward alone (runs in a
    fresh process: `compile_profile.py --model-graph-only SIZE`)."""
    import time

    import rapidgpt  # noqa: F401  (first: it sets OpenMP's wait policy before MindSpore loads)
    import mindspore as ms
    import numpy as np
    from mindspore import ParameterTuple, Tensor

    from rapidgpt.engine import RapidGPTEngine
    from rapidgpt.models.gpt import build_gpt_model, lm_loss_func
    from rapidgpt.parallel.random import initialize_parameters
    from rapidgpt.training.model_transforms import prepare_model

    flags = command(size)[5:]
    flags = flags[:flags.index("--max-new-tokens")] + flags[flags.index("--max-new-tokens") + 2:]   # a task flag
    args = RapidGPTEngine(argv=flags).args
    model = build_gpt_model(args, 4096)
    initialize_parameters(model, args.seed)
    prepare_model(model, args.precision, args.recompute, zero=args.zero)
    model.set_train(True)
    b, s = SIZES[size]["micro"], SIZES[size]["seq"]
    tokens = Tensor(np.random.default_rng(0).integers(0, 4096, (b, s + 1)).astype(np.int32))
    mask = Tensor(np.ones((b, s), np.float32))

    def loss(tokens):
        return lm_loss_func(mask, model(tokens[:, :-1], None, None, tokens[:, 1:]))
    gradients = ms.value_and_grad(loss, None, ParameterTuple(model.trainable_params()))

    @ms.jit
    def step(tokens):
        return gradients(tokens)[0]
    seconds = []
    for _ in range(4):
        start = time.perf_counter()
        float(step(tokens))
        seconds.append(time.perf_counter() - start)
    steady = statistics.median(seconds[1:])
    return seconds[0] - steady, steady


def compile_seconds(argv, env):
    """(compile seconds, steady step seconds) of one fresh run."""
    with tempfile.TemporaryDirectory() as logs:
        out = subprocess.run(argv + ["--log-dir", logs], env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"failed ({out.returncode}): {' '.join(argv)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    times = {int(i): float(ms) / 1000 for i, ms in ITERATION.findall(out.stdout)}
    steady = statistics.median(times[i] for i in times if i > 1)
    return times[1] - steady, steady


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=SIZES, default="bench")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-pipeline", action="store_true", help="leave out the 2-process pipeline row")
    parser.add_argument("--model-graph-only", choices=SIZES, help=argparse.SUPPRESS)    # the inner process
    args = parser.parse_args()
    if args.model_graph_only:
        print("MODEL GRAPH %.3f %.4f" % model_graph_seconds(args.model_graph_only))
        return 0

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cold = tempfile.mkdtemp(prefix="rapidgpt-cold-kernels-")
    rows = [("base", command(args.size), env),
            ("layers x2", command(args.size, layers_factor=2), env),
            ("micro-batches x4", command(args.size, micro_batches=4), env),
            ("no dropout", command(args.size, extra=("--hidden-dropout", "0", "--attention-dropout", "0")), env),
            ("unfused", command(args.size, extra=("--graph-kernel-fusion", "off")), env),
            ("cold kernel cache", command(args.size), None)]
    if not args.no_pipeline:
        rows.append(("pipeline stage (PP=2)",
                     command(args.size, micro_batches=4, extra=("--nproc-per-node", "2",
                                                                "--pipeline-model-parallel-size", "2")), env))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; size {args.size}: {SIZES[args.size]}")
    subprocess.run(command(args.size), env=env, cwd=ROOT, capture_output=True)     # warm the kernel cache
    results = {}
    for _ in range(args.repeats):
        for name, argv, row_env in rows:
            if row_env is None:                    # a fresh, empty kernel cache every round
                row_env = dict(env, MS_COMPILER_CACHE_PATH=tempfile.mkdtemp(dir=cold))
            results.setdefault(name, []).append(compile_seconds(argv, row_env))
        inner = subprocess.run([sys.executable, __file__, "--model-graph-only", args.size], env=env, cwd=ROOT,
                               capture_output=True, text=True)
        found = re.search(r"^MODEL GRAPH ([\d.-]+) ([\d.]+)$", inner.stdout, re.M)
        if found is None:
            raise SystemExit(f"the model-graph-only process failed:\n{inner.stdout[-2000:]}{inner.stderr[-2000:]}")
        results.setdefault("model graph only", []).append((float(found.group(1)), float(found.group(2))))
    base = statistics.median(c for c, _ in results["base"])
    print(f"{'run':<24}{'compile s':>11}{'vs base':>10}{'step s':>9}   what the difference is")
    meaning = {"layers x2": f"{SIZES[args.size]['layers']} more inlined layers",
               "micro-batches x4": "3 more unrolled micro-batches",
               "no dropout": "minus the dropout-mask graphs", "unfused": "minus the fusion passes",
               "cold kernel cache": "plus building the fused kernels",
               "pipeline stage (PP=2)": "rank 0's stage (4 micro-batches) against the whole model (1)",
               "model graph only": "forward + backward alone: base minus this = schedule + optimizer wrapper"}
    for name, values in results.items():
        c = statistics.median(v[0] for v in values)
        s = statistics.median(v[1] for v in values)
        delta = "" if name == "base" else f"{c - base:+.1f}"
        print(f"{name:<24}{c:>11.1f}{delta:>10}{s:>9.3f}   {meaning.get(name, 'the model of --size, 1 micro-batch')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
