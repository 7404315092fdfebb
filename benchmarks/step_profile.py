"""Where a RapidGPT training step's time goes (benchmarks/bench_pretrain.py's `--only profile`).

One RapidGPT run of the bench model with MindSpore's profiler (`mindspore.Profiler`, CPU activity)
on for --iters iterations after the warm-up, and the engine's Megatron timers on
(--timing-log-level 1). Per step it reports:

- each kernel category's time, from the profiler's per-kernel times (cpu_op_detail_info), by the
  kernel's type and scope: the forward (`Default/schedule...`), the backward (`Gradients/...`),
  the optimizer wrapper (every other kernel of the step graph: the loss-scale/finite check, the
  gradient norm, clipping and AdamW) and the fused kernels (their scope does not say);
- the host: the iteration's wall time minus its kernels' time (the Python loop, the step call,
  logging), with the engine's "batch-generator" timer (the data) shown apart.

A fused kernel (graph kernel fusion names it after its ops, `GraphKernel_Add_GeLU_..._fusion`) is
counted under the first category whose pattern its name matches.
"""
import collections
import csv
import glob
import os
import re
import shutil
import tempfile

# (category, pattern over the op type's "_"-separated names, first match wins); a fused kernel's
# type names its ops (GraphKernel_Reshape_Add_GeLU_Reshape_fusion). The scope decides the phase.
def _ops(*names):
    return re.compile(r"(?:^|_)(?:" + "|".join(names) + r")(?:_|$)")


KERNEL_CATEGORIES = (
    ("matmuls", _ops("MatMul", "BatchMatMul", "MatMulExt")),
    ("dropout masks", _ops("BitwiseXor", "BitwiseOr", "BitwiseAnd", "RightShift", "GreaterEqual")),
    ("softmax, mask, loss", _ops("Softmax", "SoftmaxGrad", "MaskedFill", "ReduceMax", "Exp", "Log", "GatherD",
                                 "GatherDGradV2", "Equal")),
    ("layer norm", _ops("LayerNorm", "LayerNormGrad", "ReduceMean")),   # ReduceMean: the composite's means
    ("gelu", _ops("GeLU", "GeLUGrad")),
    ("AdamW", _ops("Adam")),
    ("copies (slice, transpose, cast, ...)", _ops("StridedSlice", "StridedSliceGrad", "Split", "Concat",
                                                 "Transpose", "Cast", "Tile", "TensorMove", "Reshape",
                                                 "ZerosLike", "Gather")),
    ("other elementwise and reductions", re.compile(r".")),
)
TIMING = re.compile(r"^\s+(batch-generator|forward-backward-optimizer) \.+: \(([\d.]+), ([\d.]+)\)")


def phase_of(op_type, full_op_name):
    """forward, backward or optimizer, from the kernel's scope in the step graph; "fused" for a
    fused kernel, whose scope no longer says (it may join ops of several phases)."""
    if op_type.startswith("GraphKernel_"):
        return "fused"
    if full_op_name.startswith("Gradients/") or "/Grad_" in full_op_name:
        return "backward"
    if "/schedule-" in full_op_name or full_op_name.startswith("Expand/"):
        return "forward"        # Expand/...: the forward's expanded composite ops
    if op_type == "ReduceMean":
        return "forward"        # the fused step's LayerNorm means (no scope; the optimizer has none)
    return "optimizer"


def category_of(op_type):
    return next(name for name, pattern in KERNEL_CATEGORIES if pattern.search(op_type))


def read_kernel_times(output_dir, steps):
    """{"phase|category": ms per step} from the profiler's output under `output_dir`."""
    files = glob.glob(os.path.join(output_dir, "*", "FRAMEWORK", "cpu_op_detail_info_*.csv"))
    if not files:
        raise SystemExit(f"the profiler wrote no cpu_op_detail_info under {output_dir}")
    times = collections.defaultdict(float)
    with open(files[0]) as f:
        for row in csv.DictReader(f):
            key = f"{phase_of(row['op_type'], row['full_op_name'])}|{category_of(row['op_type'])}"
            times[key] += float(row["op_total_time(ms)"]) / steps
    return dict(times)


def run_profile(opts, bench):
    """The profiled run (in this process); `bench`: the bench_pretrain module. Returns
    {"kernels": {"phase|category": ms}, "wall_ms": ..., "timers": {name: ms}}, per step."""
    import logging

    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    output_dir = tempfile.mkdtemp(prefix="rapidgpt_profile_")
    profiler = ms.Profiler(output_path=output_dir, activities=[ProfilerActivity.CPU], start_profile=False)
    first, last = opts.warmup, opts.warmup + opts.iters       # profiled: iterations first+1 .. last
    timings = collections.defaultdict(list)

    class ProfilingClock(bench._IterationClock):
        def emit(self, record):
            super().emit(record)
            text = record.getMessage()
            for line in text.splitlines():
                match = TIMING.match(line)
                if match and self.records and first < self.records[-1][1] <= last:
                    timings[match[1]].append(float(match[3]))
            match = self.LINE.search(text)
            if match and int(match[1]) == first:
                profiler.start()
            elif match and int(match[1]) == last:
                profiler.stop()

    logging.getLogger("mindspore").setLevel(logging.ERROR)
    clock = ProfilingClock()
    bench.run_rapidgpt(opts, ["--timing-log-level", "1"] + list(bench.VARIANTS[opts.variant]), clock)
    try:
        profiler.analyse()
        kernels = read_kernel_times(output_dir, opts.iters)
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    ends = [record[0] for record in clock.records]
    return {"variant": opts.variant, "iters": opts.iters, "kernels": kernels,
            "wall_ms": (ends[last - 1] - ends[first - 1]) * 1000.0 / opts.iters,
            "timers": {name: sum(v) / len(v) for name, v in timings.items() if v}}


def print_profile(result, unprofiled_ms=None):
    """The breakdown table of a profile result (the JSON of `--only profile`); `unprofiled_ms`: the
    same step's time without the profiler, measured in the same run (the profiler slows every
    kernel: read the shares, not the milliseconds)."""
    kernels, wall = result["kernels"], result["wall_ms"]
    data = result["timers"].get("batch-generator", 0.0)
    total = sum(kernels.values())
    print(f"where a step's time goes (RapidGPT {result['variant']}, {result['iters']} profiled iterations, "
          f"ms per step; kernels from MindSpore's profiler):")
    phases = ("forward", "backward", "optimizer", "fused")
    print(f"  {'kernels':38s} " + " ".join(f"{p:>9s}" for p in phases) + f" {'total':>9s} {'share':>6s}")
    for category, _ in KERNEL_CATEGORIES:
        row = [kernels.get(f"{p}|{category}", 0.0) for p in phases]
        if sum(row) > 0:
            print(f"  {category:38s} " + " ".join(f"{v:9.1f}" for v in row) + f" {sum(row):9.1f} "
                  f"{sum(row) / wall:6.1%}")
    host = wall - total - data
    pad = " " * (10 * len(phases) - 1)
    print(f"  {'all kernels':38s} {pad} {total:9.1f} {total / wall:6.1%}")
    print(f"  {'data (the batch-generator timer)':38s} {pad} {data:9.1f} {data / wall:6.1%}")
    print(f"  {'host (the rest of the iteration)':38s} {pad} {host:9.1f} {host / wall:6.1%}")
    print(f"  {'iteration (wall, profiler on)':38s} {pad} {wall:9.1f}")
    if unprofiled_ms:
        print(f"  {'iteration without the profiler':38s} {pad} {unprofiled_ms:9.1f}   (best median of the rounds "
              f"above; the profiler slows the kernels: read the shares)")
