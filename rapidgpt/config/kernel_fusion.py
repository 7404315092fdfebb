"""Graph kernel fusion: MindSpore's `enable_graph_kernel`, which fuses the compiled step's chains
of elementwise ops and reductions (GELU and its gradient, dropout, LayerNorm's gradient, the
loss, AdamW) into generated kernels. Flag: `--graph-kernel-fusion auto|on|off`.

Why it matters (measured on the bench model, benchmarks/bench_pretrain.py): MindSpore's CPU
backend runs most elementwise ops as separate, scalar kernels -- one GELU forward and backward of
a `[1024, 1024]` tensor takes longer than the matrix product before it -- so without fusion
half of a step's time is outside the matrix products.

What it needs on the CPU: MindSpore compiles the fused kernels with its bundled AKG/TVM at the
first step, which imports the `decorator` package (a RapidGPT dependency) and links each kernel
with `g++`. Compiled kernels are cached in `MS_COMPILER_CACHE_PATH` (RapidGPT's default:
`graph_kernels/` in its cache, `~/.cache/rapidgpt` or $RAPIDGPT_CACHE_DIR), so a kernel is built
once per machine (the first step of a new model shape compiles for longer: +17 s for a tiny GPT,
+30 s for the bench model; a cached kernel costs nothing). A kernel that has to be built leaves
AKG's `dsa_transfrom.log` in the working directory (its lock file, `kernel_build_tmp.key`, goes
into the cache).

OpenMP: the fused CPU kernels run on OpenMP threads (libgomp), which by default spin after each
kernel and take the cores MindSpore's own kernels need next: on the bench model the fused step ran
at 969 tokens/s with spinning threads and 1394 with `OMP_WAIT_POLICY=passive` (unfused: 1060 and
952). libgomp reads the variable once, when `import mindspore` loads it, so `import rapidgpt` sets
it to passive beforehand (`set_openmp_wait_policy`) where fusion can be on, unless it is set
already; the start-up line warns when MindSpore was imported first.

auto (the default) turns it on on the CPU where both are present and says why not otherwise, in
the start-up line; on Ascend/GPU it stays MindSpore's default (off) unless `on` is given. `on`
where a requirement is missing is an error naming it.

Numerics: the fused kernels compute the same formulas in a different order (and tanh/exp by their
own approximations), so losses differ from an unfused run in the 5th significant digit. Every run
of a layout uses the same kernels, so the parallel layouts still reproduce the single-process run
(the equivalence tests run with fusion on where it is available).
"""
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass

CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class KernelFusionConfig:
    mode: str = "auto"

    @classmethod
    def from_args(cls, args):
        return cls(args.graph_kernel_fusion)


def add_kernel_fusion_args(parser):
    g = parser.add_argument_group("kernel fusion", "MindSpore's graph kernel fusion in the compiled step")
    g.add_argument("--graph-kernel-fusion", choices=CHOICES, default="auto",
                   help="fuse the step's elementwise ops and reductions into generated kernels (MindSpore's "
                        "enable_graph_kernel). auto: on on the CPU when the decorator package and g++ are "
                        "there (the kernels are built with g++ once and cached in RapidGPT's cache); on: "
                        "anywhere, an error when a requirement is missing; off: MindSpore's plain kernels")


def check_kernel_fusion_args(args, check):
    """Set `args.kernel_fusion` (a KernelFusionConfig); the requirements are checked where the
    device is known (`enable_kernel_fusion`)."""
    args.kernel_fusion = KernelFusionConfig.from_args(args)


def missing_requirements(device):
    """What graph kernel fusion lacks here (empty: nothing). Only the CPU builds kernels with g++."""
    if device != "cpu":
        return []
    missing = []
    if importlib.util.find_spec("decorator") is None:
        missing.append("the decorator package (pip install decorator)")
    if shutil.which("g++") is None:
        missing.append("g++ on PATH (e.g. apt-get install g++)")
    return missing


def set_openmp_wait_policy():
    """OMP_WAIT_POLICY=passive before MindSpore loads libgomp, where fusion can be on and the user has
    not chosen a policy (called by `import rapidgpt`). Too late once mindspore is imported."""
    if "OMP_WAIT_POLICY" not in os.environ and "mindspore" not in sys.modules and not missing_requirements("cpu"):
        os.environ["OMP_WAIT_POLICY"] = "passive"


def openmp_note():
    """What the start-up line adds when fused kernels' OpenMP threads will spin."""
    policy = os.environ.get("OMP_WAIT_POLICY", "")
    if policy.lower() == "passive":
        return ""
    why = f"OMP_WAIT_POLICY={policy}" if policy else "mindspore was imported before rapidgpt"
    return (f"; WARNING: the fused kernels' OpenMP threads spin ({why}), ~30% slower on CPU: export "
            f"OMP_WAIT_POLICY=passive")


def kernel_cache_dir():
    """Where the compiled kernels are kept between runs: graph_kernels/ in RapidGPT's cache."""
    from rapidgpt.utils import cache_root
    return os.path.join(cache_root(), "graph_kernels")


def check_kernel_fusion_backend(config, device):
    """One line instead of a failure at the first compile: `on` where a requirement is missing."""
    missing = missing_requirements(device)
    if config.mode == "on" and missing:
        return (f"--graph-kernel-fusion on: it needs {' and '.join(missing)}; install them, or use "
                f"--graph-kernel-fusion auto (on where they are present) or off")
    return None


def enable_kernel_fusion(config, device):
    """Switch fusion on or off as `config` says for `device` (checked by check_kernel_fusion_backend),
    before anything compiles (a process may run several engines: each sets it). Returns what the
    start-up line says."""
    import mindspore as ms

    missing = missing_requirements(device)
    if config.mode == "off":
        state = "off (--graph-kernel-fusion off)"
    elif config.mode == "auto" and device != "cpu":
        state = f"off (MindSpore's default on {device}; --graph-kernel-fusion on to try it)"
    elif missing:
        state = f"off (needs {' and '.join(missing)})"
    else:
        state = "on (MindSpore's enable_graph_kernel"
        if device == "cpu":
            # A user's own MS_COMPILER_CACHE_PATH wins; MindSpore's default is the working directory.
            os.environ.setdefault("MS_COMPILER_CACHE_PATH", kernel_cache_dir())
            os.makedirs(os.environ["MS_COMPILER_CACHE_PATH"], exist_ok=True)
            state += f", kernels cached in {os.environ['MS_COMPILER_CACHE_PATH']}){openmp_note()}"
        else:
            state += ")"
    ms.set_context(enable_graph_kernel=state.startswith("on"))
    return state
