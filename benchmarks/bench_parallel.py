#!/usr/bin/env python
"""Tensor, data and pipeline parallelism and ZeRO-1/2/3 on 2 processes against 1 process, their
communication share, the pipeline's bubble and ZeRO's memory, measured in the same run.

Every run is `rapidgpt --task pretraining` on the embedded demo corpus with the same GPT (4 layers,
hidden 256, 4 heads, seq 128, fp32, dropout 0.1, AdamW) and the same global batch (16 samples):

    1 process              micro batch 8, 2 micro-batches per step, 2 CPU threads
    TP=2, 2 processes      micro batch 8, 2 micro-batches per step, 1 CPU thread each
    DP=2, 2 processes      micro batch 8, 1 micro-batch per rank,    1 CPU thread each

Throughput = global batch x seq / the median "elapsed time per iteration" of the iterations after
--warmup (rank 0's Megatron log lines, --log-interval 1).

Communication share: each 2-process layout runs a second time with every collective replaced by
the identity (this script re-enters itself as the msrun worker and swaps the all-reduce primitive
of rapidgpt.parallel.comm, through which every collective of RapidGPT goes, for `nn.Identity`):
the ranks then do exactly their computation without exchanging anything (the losses are
meaningless). share = 1 - t(no communication) / t(real). The CPU backend's collectives are
all-reduces over TCP (MindSpore's mccl); the emulations' zero-filled buffers stay in both runs.

Pipeline: PP=2 (1F1B) with m = 2, 4, 8 micro-batches per step (micro batch 8, 4, 2), each beside
one process with the same micro-batches. The measured bubble of a stage is the time it spends in
point-to-point exchanges (waiting for its neighbour, plus the transfer itself) divided by its step
time, from RapidGPT's --timing-log-level 2 timers ("pipeline-p2p", "forward-backward-optimizer",
every rank's with --timing-log-option all); Megatron's ideal bubble is (P - 1) / (m + P - 1).

ZeRO: DP=2 without ZeRO, with --zero-1-memory-optimization, --zero-2-memory-optimization and
--zero-3-memory-optimization: tokens/s, rank 0's model states as it logs them (bytes of the tensors it holds, the gradients it
hands the optimizer) and the peak RSS of the largest process.

    python benchmarks/bench_parallel.py [--iters 20] [--warmup 5] [--port 29650] [--only tp-dp|pp|zero]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH, SEQ = 16, 128
MODEL = ["--task", "pretraining", "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", str(SEQ), "--micro-batch-size", "8", "--global-batch-size", str(GLOBAL_BATCH),
         "--lr", "1e-3", "--lr-warmup-iters", "2", "--log-interval", "1", "--no-progress-bar",
         "--max-new-tokens", "0", "--eval-iters", "0", "--seed", "1"]
ELAPSED = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)")
WORKER_FLAG = "--worker-without-communication"
RANK_TIMES = re.compile(r"  ([\w-]+):\n((?:     rank +\d+: [\d.]+\n?)+)")


def run_without_communication(cli_argv):
    """msrun worker: the rapidgpt CLI with every collective an identity (see the module doc)."""
    sys.path.insert(0, ROOT)
    import types

    from mindspore import nn, ops

    from rapidgpt import cli
    from rapidgpt.parallel import comm
    comm.ops = types.SimpleNamespace(**{name: getattr(ops, name) for name in dir(ops) if not name.startswith("_")})
    comm.ops.AllReduce = lambda *args, **kwargs: nn.Identity()
    return cli.main(cli_argv)


def iteration_times(log, warmup):
    times = {int(it): float(ms) for it, ms in ELAPSED.findall(log)}
    kept = [ms for it, ms in sorted(times.items()) if it > warmup]
    if not kept:
        raise RuntimeError(f"no iteration lines after the warm-up in:\n{log[-3000:]}")
    return statistics.median(kept)


def rank_timers(log, warmup):
    """{timer: [per-rank ms, median over the logged iterations after the warm-up]} from the
    --timing-log-option all blocks (one per iteration with --log-interval 1)."""
    blocks = {}
    for name, rows in RANK_TIMES.findall(log):
        blocks.setdefault(name, []).append([float(v) for v in re.findall(r": ([\d.]+)", rows)])
    return {name: [statistics.median(column) for column in zip(*values[warmup:])] for name, values in blocks.items()}


# Runs a command and reports the peak RSS of the largest process of its tree (msrun waits for its
# workers, so their peaks reach this process's RUSAGE_CHILDREN).
PEAK_RSS_WRAPPER = ("import resource, subprocess, sys; status = subprocess.run(sys.argv[1:]).returncode; "
                    "print('peak rss kb:', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                    "sys.exit(status)")
PEAK_RSS = re.compile(r"peak rss kb: (\d+)")
HELD = re.compile(r"model states held on this rank: weights (\d+) bytes, main parameters and optimizer state (\d+)")
HANDED = re.compile(r"gradients handed to the optimizer on this rank: (\d+) bytes")


def run(label, nproc, extra, opts, communicate=True, want_log=False, peak_rss=None):
    """Median iteration time (ms) of one configuration (and rank 0's log); with `peak_rss` (a
    dict) its peak RSS in MiB is stored under `label`."""
    train = MODEL + ["--train-iters", str(opts.warmup + opts.iters)] + extra
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryDirectory() as logs:
        if nproc == 1:
            command = [sys.executable, "-m", "rapidgpt.cli"] + train + ["--cpu-threads", "2"]
        elif communicate:
            command = [sys.executable, "-m", "rapidgpt.cli"] + train + [
                "--nproc-per-node", str(nproc), "--master-port", str(opts.port), "--log-dir", logs,
                "--cpu-threads", "1"]
        else:
            command = ["msrun", "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_port",
                       str(opts.port), "--log_dir", logs, "--join", "True", "--cluster_time_out", "300",
                       os.path.abspath(__file__), WORKER_FLAG] + train + ["--cpu-threads", "1"]
        if peak_rss is not None:
            command = [sys.executable, "-c", PEAK_RSS_WRAPPER] + command
        out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if peak_rss is not None:
            peak_rss[label] = int(PEAK_RSS.findall(out.stderr)[-1]) / 1024
        log = out.stdout
        if nproc > 1 and os.path.exists(os.path.join(logs, "worker_0.log")):
            with open(os.path.join(logs, "worker_0.log")) as f:
                log = f.read()
    if out.returncode != 0:
        raise RuntimeError(f"{label} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    median = iteration_times(log, opts.warmup)
    print(f"  {label:<34} {median:8.1f} ms/iteration  {GLOBAL_BATCH * SEQ / median * 1000:8.1f} tokens/s",
          flush=True)
    return (median, log) if want_log else median


def pipeline(opts):
    """PP=2 beside one process at m = 2, 4, 8; the measured bubble beside Megatron's."""
    rows = []
    for m in (2, 4, 8):
        micro = ["--micro-batch-size", str(GLOBAL_BATCH // m)]
        single = run(f"1 process, m={m}", 1, micro, opts)
        real, log = run(f"PP=2, 2 processes, m={m}", 2, micro + [
            "--pipeline-model-parallel-size", "2", "--timing-log-level", "2", "--timing-log-option", "all"],
            opts, want_log=True)
        timers = rank_timers(log, opts.warmup)
        bubbles = [p2p / step for p2p, step in zip(timers["pipeline-p2p"], timers["forward-backward-optimizer"])]
        rows.append((m, single, real, bubbles, 1 / (m + 1)))
    print(f"\n{'PP=2':<6} {'tokens/s':>9} {'1 process':>10} {'ratio':>6} {'bubble stage 0, 1':>19} {'Megatron (P-1)/(m+P-1)':>24}")
    for m, single, real, bubbles, ideal in rows:
        print(f"m={m:<4} {GLOBAL_BATCH * SEQ / real * 1000:9.1f} {GLOBAL_BATCH * SEQ / single * 1000:10.1f} "
              f"{single / real:5.2f}x {bubbles[0]:9.0%} {bubbles[1]:8.0%} {ideal:23.0%}")


def zero(opts):
    """ZeRO-1, 2 and 3 beside plain DP=2: tokens/s, rank 0's model states (measured from the
    tensors it holds and is handed) and the peak RSS of the largest process."""
    rows, peaks = [], {}
    for label, extra in (("DP=2", []), ("DP=2, ZeRO-1", ["--zero-1-memory-optimization"]),
                         ("DP=2, ZeRO-2", ["--zero-2-memory-optimization"]),
                         ("DP=2, ZeRO-3", ["--zero-3-memory-optimization"])):
        median, log = run(label, 2, extra, opts, want_log=True, peak_rss=peaks)
        weights, state = map(int, HELD.search(log).groups())
        rows.append((label, median, weights, int(HANDED.search(log).group(1)), state))
    print(f"\n{'layout':<14} {'tokens/s':>9} {'weights MiB':>12} {'gradients MiB':>14} {'main+optimizer MiB':>19} "
          f"{'peak RSS MiB':>13}")
    for label, median, weights, gradients, state in rows:
        print(f"{label:<14} {GLOBAL_BATCH * SEQ / median * 1000:9.1f} {weights / 2**20:12.1f} {gradients / 2**20:14.1f} "
              f"{state / 2**20:19.1f} {peaks[label]:13.0f}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == WORKER_FLAG:
        return run_without_communication(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per run")
    parser.add_argument("--warmup", type=int, default=5, help="iterations left out (compile, caches)")
    parser.add_argument("--port", type=int, default=29650, help="msrun master port")
    parser.add_argument("--only", choices=["tp-dp", "pp", "zero"], default=None, help="run one part")
    opts = parser.parse_args()
    print(f"GPT 4 x 256, seq {SEQ}, global batch {GLOBAL_BATCH}, fp32; median of {opts.iters} iterations "
          f"after {opts.warmup}; {os.cpu_count()} CPU cores")
    parts = {"tp-dp": tensor_and_data, "pp": pipeline, "zero": zero}
    for name, part in parts.items():
        if opts.only in (None, name):
            part(opts)
    return 0


def tensor_and_data(opts):
    single = run("1 process (baseline)", 1, [], opts)
    results = {}
    for name, extra in (("TP=2", ["--tensor-model-parallel-size", "2"]), ("DP=2", [])):
        real = run(f"{name}, 2 processes", 2, extra, opts)
        alone = run(f"{name}, 2 processes, no communication", 2, extra, opts, communicate=False)
        results[name] = real, alone
    print(f"\n{'layout':<8} {'tokens/s':>9} {'vs 1 process':>13} {'communication share':>20}")
    print(f"{'1 proc':<8} {GLOBAL_BATCH * SEQ / single * 1000:9.1f} {1.0:12.2f}x {'-':>20}")
    for name, (real, alone) in results.items():
        print(f"{name:<8} {GLOBAL_BATCH * SEQ / real * 1000:9.1f} {single / real:12.2f}x "
              f"{max(0.0, 1 - alone / real):19.0%}")


if __name__ == "__main__":
    sys.exit(main())
