"""Graph kernel fusion: MindSpore's graph kernel fusion (`enable_graph_kernel`), which fuses the
compiled step's chains of elementwise ops and reductions (GELU and its gradient, dropout, the attention mask and
scaling, LayerNorm, the loss, AdamW) into generated kernels. Flag: `--graph-kernel-fusion auto|on|off`.

Why it matters (measured on the bench model, benchmarks/bench_pretrain.py): MindSpore's CPU
backend runs most elementwise ops as separate, scalar kernels -- one GELU forward and backward of
a `[1024, 1024]` tensor takes longer than the matrix product before it -- so without fusion
half of a step's time is outside the matrix products.

What it needs on the CPU: MindSpore compiles the fused kernels with its bundled AKG/TVM at the
first step, which imports the `decorator` package (a RapidGPT dependency) and links each kernel
with `g++`. Compiled kernels are cached in `MS_COMPILER_CACHE_PATH` (RapidGPT's default:
`graph_kernels/mindspore-<version>/rank_<rank>/` in its cache, `~/.cache/rapidgpt` or $RAPIDGPT_CACHE_DIR),
so a kernel is built once per machine (the first step of a new model shape compiles for longer:
+17 s for a tiny GPT, +30 s for the bench model; a cached kernel costs nothing). A kernel that has to be built leaves
AKG's `dsa_transfrom.log` in the working directory (its lock file, `kernel_build_tmp.key`, goes
into the cache).

OpenMP: the fused CPU kernels run on OpenMP threads (libgomp), which by default spin after each
kernel and take the cores MindSpore's own kernels need next: on the bench model the fused step ran
at 969 tokens/s with spinning threads and 1394 with `OMP_WAIT_POLICY=passive` (unfused, the
other way round: 1060 and 952). libgomp reads the variable once, when `import mindspore` loads it, so `import rapidgpt` sets
it to passive beforehand (`set_openmp_environment`) where fusion can be on, unless it is set
already or the command line says `--graph-kernel-fusion off`; the start-up line warns when
MindSpore was imported first.

The switch: MindSpore 2.10 deprecates `set_context(enable_graph_kernel=True)` (a warning at every
set) in favour of `jit_config={"jit_level": "O1"}`, which does not fuse on the CPU (measured: a GELU
forward and backward of `[1024, 1024]` took 83 ms with it, 60 ms plain, 5.7 ms with
enable_graph_kernel). The environment variable MindSpore names for graph kernel settings,
`MS_DEV_GRAPH_KERNEL_FLAGS`, with `--opt_level=2` fuses exactly as enable_graph_kernel does (the
same gradients bit for bit, measured on a LayerNorm+GELU chain) and is read at every compile, so
RapidGPT switches fusion by adding or removing that one flag there; a user's other flags in the
variable are kept.

AKG's messages: AKG looks for a tiling repository (an empty `{}` for the CPU, inside MindSpore's
package) and, unless AKG_WHITE_LIST_PATH allows the package's directory, prints "Please set tiling
repo path specified by env AKG_WHITE_LIST_PATH or current path" for every kernel it builds, then
uses `{}` anyway. RapidGPT sets AKG_WHITE_LIST_PATH (unless set) to the directory holding both the
working directory and MindSpore's package -- the working directory stays allowed for a user's own
AKG operators -- so the same empty repository is read without the message.

auto (the default) turns it on on the CPU where both are present, for fp32 models, and says why
not otherwise in the start-up line; 16-bit models on the CPU stay unfused (HALF_ON_CPU below); on
Ascend/GPU MindSpore's own setting is left as it is unless `on` is given. `on` where it cannot
work is an error naming the reason.

LayerNorm: MindSpore's CPU LayerNorm kernels are slow (forward and backward of `[1024, 256]`:
7.3-8.7 ms; the same as fused elementwise ops and reductions: 1.75 ms). Where fusion is on on the CPU,
RapidGPT's LayerNorm is therefore written as those ops (`composite_layer_norm` in
rapidgpt/models/norms.py, switched on by rapidgpt/training/model_transforms.py): the bench
model's step ran 13-16% faster (benchmarks/bench_pretrain.py --only rapidgpt, alternating runs).
Not used: MindSpore's own expansion of its LayerNorm kernels into such ops
(`MS_DEV_GRAPH_KERNEL_FLAGS=--enable_expand_ops=LayerNorm,LayerNormGrad`; 1.3 ms): with MindSpore 2.10 it
computes a wrong forward at TP=2 with selective recompute (the first loss 8.3218 instead of 8.3290,
which TP=2 without recompute, and the same run without the expansion, print), and a pipeline stage
and the single process round it differently (tied embedding elements 1.9e-5 apart after 12 steps,
against 1e-5 allowed). RapidGPT's composite form passes both of those equivalence tests. Measured
2026-11-26.

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

from rapidgpt.utils import flag_value

CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class KernelFusionConfig:
    mode: str = "auto"
    half: bool = False          # a 16-bit model (--fp16/--bf16)

    @classmethod
    def from_args(cls, args):
        return cls(args.graph_kernel_fusion, args.precision.half)


# Measured with MindSpore 2.10: AKG fails to build a fused kernel of an fp16 step on the CPU
# ("Check failed: attr->IsInstance<StringImm>()" in GetDstTypeFromAttrs, for a fused pair of
# casts), and the step then fails at its first compile; fp16 is slower than fp32 on the CPU anyway.
# An emulated bf16 step (rapidgpt/emulated_bf16.py) fails the same way: "Not support dtype str
# bfloat16" for its fp32 -> bf16 -> fp32 casts.
HALF_ON_CPU = ("MindSpore's CPU kernel compiler (AKG) fails to build the fused casts of a 16-bit step "
               "(measured with --fp16 and --bf16, MindSpore 2.10)")


def add_kernel_fusion_args(parser):
    g = parser.add_argument_group("kernel fusion", "MindSpore's graph kernel fusion in the compiled step")
    g.add_argument("--graph-kernel-fusion", choices=CHOICES, default="auto",
                   help="fuse the step's elementwise ops and reductions into generated kernels (MindSpore's "
                        "graph kernel fusion). auto: on on the CPU when the decorator package and g++ are "
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


def set_openmp_environment(argv=None):
    """Where fusion can be on, before MindSpore loads libgomp (called by `import rapidgpt`; too late
    once mindspore is imported): OMP_WAIT_POLICY=passive, and OMP_NUM_THREADS from --cpu-threads
    (the fused kernels' OpenMP teams do not follow MindSpore's threads_num; msrun gives its workers
    OMP_NUM_THREADS=1). A variable already set is kept. A command line (`argv`, default sys.argv)
    with `--graph-kernel-fusion off` changes nothing: the unfused step is faster with libgomp's
    default policy (the numbers in this module's docstring)."""
    argv = sys.argv if argv is None else argv
    if "mindspore" in sys.modules or flag_value(argv, "--graph-kernel-fusion") == "off" or missing_requirements("cpu"):
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    threads = flag_value(argv, "--cpu-threads")
    if threads and threads.isdigit() and int(threads) > 0:
        os.environ.setdefault("OMP_NUM_THREADS", threads)


def openmp_note():
    """What the start-up line adds when fused kernels' OpenMP threads will spin."""
    policy = os.environ.get("OMP_WAIT_POLICY", "")
    if policy.lower() == "passive":
        return ""
    why = f"OMP_WAIT_POLICY={policy}" if policy else "mindspore was imported before rapidgpt"
    return (f"; WARNING: the fused kernels' OpenMP threads spin ({why}), ~30% slower on CPU: export "
            f"OMP_WAIT_POLICY=passive")


_CACHE_SET_HERE = None      # the MS_COMPILER_CACHE_PATH this module set (a user's own is left alone)


def use_kernel_cache(rank):
    """Point MS_COMPILER_CACHE_PATH (where MindSpore keeps compiled kernels; its default is the
    working directory) at graph_kernels/mindspore-<version>/rank_<rank>/ in RapidGPT's cache, unless
    the user set it; create it. Returns the path (OSError when it cannot be created).

    One cache per rank: the ranks of a job build the same kernels at the same moment, and MindSpore
    2.10 does not guard a shared `akg_kernel_meta` against that. Measured in the test suite: a rank
    found a kernel another rank was still writing, failed its hash check, could not rebuild it and
    stopped ("GetOutputKernelObjectType"), and the job with it. So that a kernel is still built
    once per machine rather than once per rank, another rank's cache starts each job with copies of
    the kernels rank 0's holds (`_copy_missing_kernels`)."""
    global _CACHE_SET_HERE
    import mindspore as ms
    from rapidgpt.utils import cache_root

    path = os.environ.get("MS_COMPILER_CACHE_PATH")
    if path is None or path == _CACHE_SET_HERE:
        ranks = os.path.join(cache_root(), "graph_kernels", f"mindspore-{ms.__version__}")
        path = _CACHE_SET_HERE = os.path.join(ranks, f"rank_{rank}")
        os.environ["MS_COMPILER_CACHE_PATH"] = path
        if rank:
            _copy_missing_kernels(os.path.join(ranks, "rank_0", KERNELS), os.path.join(path, KERNELS))
    os.makedirs(path, exist_ok=True)
    return path


KERNELS = "akg_kernel_meta"         # where MindSpore keeps a cache's kernels


def _copy_missing_kernels(source, target):
    """Copy into `target` the kernel files of `source` it lacks. Copies, not links: a kernel
    MindSpore finds damaged it rebuilds in place, which must not write into another rank's cache.
    A file rank 0 is still writing (a job running beside this one) fails MindSpore's hash check
    here and is rebuilt in this rank's own cache: a rebuild, not the shared cache's race."""
    if not os.path.isdir(source):
        return
    os.makedirs(target, exist_ok=True)
    have = set(os.listdir(target))
    for name in os.listdir(source):
        if name not in have:
            try:
                shutil.copy2(os.path.join(source, name), os.path.join(target, name))
            except OSError:         # gone meanwhile, or unreadable: MindSpore builds it
                pass


def check_kernel_fusion_backend(config, device):
    """One line instead of a failure at the first compile: `on` where a requirement is missing, or
    for a 16-bit model on the CPU."""
    missing = missing_requirements(device)
    if config.mode == "on" and missing:
        return (f"--graph-kernel-fusion on: it needs {' and '.join(missing)}; install them, or use "
                f"--graph-kernel-fusion auto (on where they are present) or off")
    if config.mode == "on" and config.half and device == "cpu":
        return f"--graph-kernel-fusion on: not for a 16-bit model on the CPU: {HALF_ON_CPU}; use auto or off"
    return None


FLAGS_VARIABLE = "MS_DEV_GRAPH_KERNEL_FLAGS"
FUSE = "--opt_level=2"


def _fusion_flags(on):
    """MS_DEV_GRAPH_KERNEL_FLAGS with fusion switched on or off, the user's other flags kept."""
    kept = [flag for flag in os.environ.get(FLAGS_VARIABLE, "").split() if not flag.startswith("--opt_level=")]
    flags = " ".join(kept + ([FUSE] if on else []))
    if flags:
        os.environ[FLAGS_VARIABLE] = flags
    else:
        os.environ.pop(FLAGS_VARIABLE, None)


def _fusion_is_on():
    """Whether MindSpore will fuse: a positive --opt_level in MS_DEV_GRAPH_KERNEL_FLAGS, or the
    deprecated context switch a user may have set."""
    import mindspore as ms

    levels = [flag.split("=", 1)[1] for flag in os.environ.get(FLAGS_VARIABLE, "").split()
              if flag.startswith("--opt_level=")]
    if levels:
        return levels[-1] not in ("0", "")
    return bool(ms.get_context("enable_graph_kernel"))


def _allow_akg_repository():
    """AKG_WHITE_LIST_PATH covering MindSpore's package and the working directory (module docstring)."""
    import mindspore as ms

    package = os.path.dirname(os.path.realpath(ms.__file__))
    os.environ.setdefault("AKG_WHITE_LIST_PATH", os.path.commonpath([package, os.path.realpath(os.getcwd())]))


def fuses_on_cpu():
    """Whether the compiled step is fused on the CPU (`enable_kernel_fusion` switched it on)."""
    import mindspore as ms

    return ms.get_context("device_target") == "CPU" and _fusion_is_on()


def enable_kernel_fusion(config, device, rank):
    """Switch fusion on or off as `config` says for `device` (checked by check_kernel_fusion_backend),
    with this `rank`'s kernel cache,
    before anything compiles (a process may run several engines: each sets it; auto on Ascend/GPU
    leaves MindSpore's setting as it is). Returns what the start-up line says."""
    import mindspore as ms

    missing = missing_requirements(device)
    if config.mode == "auto" and device != "cpu":
        return f"off unless set in MindSpore (its default on {device}; --graph-kernel-fusion on to try it)"
    if config.mode == "off":
        state = "off (--graph-kernel-fusion off)"
    elif missing:
        state = f"off (needs {' and '.join(missing)})"
    elif config.half and device == "cpu":
        state = f"off (16-bit model: {HALF_ON_CPU})"
    elif device != "cpu":
        state = f"on (MindSpore's graph kernel fusion, {FLAGS_VARIABLE}={FUSE})"
    else:
        try:
            cache = use_kernel_cache(rank)
            _allow_akg_repository()
            state = (f"on (MindSpore's graph kernel fusion, {FLAGS_VARIABLE}={FUSE}, kernels cached in "
                     f"{cache}){openmp_note()}")
        except OSError as error:
            state = f"off (no kernel cache: {error}; set MS_COMPILER_CACHE_PATH to a writable directory)"
    _fusion_flags(state.startswith("on"))
    if ms.get_context("enable_graph_kernel"):       # a user's deprecated switch would override "off"
        ms.set_context(enable_graph_kernel=False)
    return state
