#!/usr/bin/env python
"""Peak memory and step time of RapidGPT training with each activation-recompute setting, compiled
(mindspore.jit, the default) and eager (--no-jit), each in a fresh process.

The model is chosen so that activations dominate the memory the backward needs: GPT, 4 layers,
hidden 256, 4 heads, seq 512, micro batch 8, vocabulary 8000 (weights + Adam state ~40 MiB).
Megatron's count of the activations a layer keeps for its backward (Korthikanti et al. 2022):
s*b*h*(34 + 5*a*s/h) bytes at 16 bits, twice that in fp32 -- ~148 MiB per layer here
(`activation_bytes`). 8 layers at seq 1024 needs more than this machine's 24 GiB under jit
(measured), so the default stays at 4 x 512.

Each configuration runs the engine's real path (bench_pretrain.run_rapidgpt: parse_args ->
RapidGPTEngine -> GPTPretrainer.train with synthetic data) under a watchdog that stops it above
--limit-mib; peak RSS is the child's own ru_maxrss. Step time: the mean of the iterations after the
first (which compiles).

    python benchmarks/bench_memory.py [--layers 4] [--hidden 256] [--seq 512] [--micro-batch 8]
                                      [--iters 2] [--configs none,full-uniform-1,...] [--modes jit,eager]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_pretrain import MODELS, RESULT_PREFIX, run_rapidgpt      # noqa: E402

CONFIGS = {
    "none": [],
    "full-uniform-1": ["--checkpoint-activations"],
    "full-uniform-2": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                       "--recompute-num-layers", "2"],
    "full-block-2": ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "2"],
    "selective": ["--recompute-activations"],
}
MODES = {"jit": [], "eager": ["--no-jit"]}


def activation_bytes(layers, hidden, heads, seq, micro_batch):
    """Activations a GPT layer keeps for its backward in fp32 (Korthikanti et al. 2022, Table 2's
    34*s*b*h + 5*a*s^2*b bytes at 16 bits, doubled for fp32), times the layers."""
    per_layer_16bit = seq * micro_batch * hidden * 34 + 5 * heads * seq * seq * micro_batch
    return layers * per_layer_16bit * 2


def run_child(opts, config, mode):
    """One configuration in a fresh process under the RSS watchdog -> its result dict."""
    command = [sys.executable, os.path.abspath(__file__), "--child", config, mode, "--layers", str(opts.layers),
               "--hidden", str(opts.hidden), "--seq", str(opts.seq), "--micro-batch", str(opts.micro_batch),
               "--iters", str(opts.iters)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    over = False
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024.0
            if rss > opts.limit_mib:
                proc.kill()
                over = True
        except (FileNotFoundError, StopIteration):
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
    if over:
        return {"error": f"over --limit-mib {opts.limit_mib:.0f}"}
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {(err.strip().splitlines() or [''])[-1][:200]}"}
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def child(opts):
    config, mode = opts.child
    model = dict(MODELS["bench"], num_layers=opts.layers, hidden_size=opts.hidden, seq_length=opts.seq,
                 micro_batch_size=opts.micro_batch)
    run_opts = argparse.Namespace(warmup=1, iters=opts.iters, lr=6e-4, clip_grad=1.0, threads=2, show_log=False,
                                  dims=model, model="gpt")
    result = run_rapidgpt(run_opts, CONFIGS[config] + MODES[mode])
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--iters", type=int, default=2, help="measured iterations after the compiling one")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"from {', '.join(CONFIGS)}")
    parser.add_argument("--modes", default=",".join(MODES), help="jit (compiled step), eager (--no-jit)")
    parser.add_argument("--limit-mib", type=float, default=16384, help="stop a run whose RSS passes this")
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "MODE"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return child(opts)
    configs, modes = opts.configs.split(","), opts.modes.split(",")
    for name, known in (("--configs", CONFIGS), ("--modes", MODES)):
        unknown = sorted(set(configs if name == "--configs" else modes) - set(known))
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    heads = MODELS["bench"]["num_heads"]
    estimate = activation_bytes(opts.layers, opts.hidden, heads, opts.seq, opts.micro_batch) / 2 ** 20
    print(f"GPT {opts.layers} layers, hidden {opts.hidden}, {heads} heads, seq {opts.seq}, micro batch "
          f"{opts.micro_batch}, fp32, dropout {MODELS['bench']['dropout']}; activations kept without recompute "
          f"(Megatron's count): ~{estimate:.0f} MiB; {opts.iters} measured iteration(s) after the first")
    print(f"  {'config':16s} {'mode':6s} {'peak RSS':>10s} {'vs none':>8s} {'s/step':>7s} {'time':>7s}")
    results = {}
    for mode in modes:
        for config in configs:
            r = results[mode, config] = run_child(opts, config, mode)
            base = results.get((mode, "none"))
            if "error" in r:
                print(f"  {config:16s} {mode:6s} {r['error']}", flush=True)
                continue
            delta = cost = ""
            if base and "error" not in base and config != "none":
                delta = f"{100 * (r['peak_rss_mib'] / base['peak_rss_mib'] - 1):+.0f}%"
                cost = f"{100 * (r['s_per_iter'] / base['s_per_iter'] - 1):+.0f}%"
            print(f"  {config:16s} {mode:6s} {r['peak_rss_mib']:6.0f} MiB {delta:>8s} {r['s_per_iter']:7.2f} "
                  f"{cost:>7s}", flush=True)
    for mode in modes:
        base = results.get((mode, "none"))
        if not base or "error" in base:
            continue
        lower = [c for c in configs if c != "none" and "error" not in results[mode, c]
                 and results[mode, c]["peak_rss_mib"] < 0.98 * base["peak_rss_mib"]]
        print(f"{mode}: " + (f"peak RSS lowered (by >2%) by {', '.join(lower)}" if lower
                             else "no recompute setting lowered peak RSS"))
    if ("jit", "none") in results and ("eager", "none") in results and \
            "error" not in results["jit", "none"] and "error" not in results["eager", "none"]:
        jit, eager = results["jit", "none"], results["eager", "none"]
        print(f"eager (--no-jit) vs compiled, no recompute: peak RSS {eager['peak_rss_mib']:.0f} vs "
              f"{jit['peak_rss_mib']:.0f} MiB ({100 * (eager['peak_rss_mib'] / jit['peak_rss_mib'] - 1):+.0f}%), "
              f"{eager['s_per_iter']:.2f} vs {jit['s_per_iter']:.2f} s/step")


if __name__ == "__main__":
    main()
