"""The compile cache: a second start of the same run loads the training step's compiled graph
instead of compiling it again. Flag: `--compile-cache on|off` (on by default).

Why: compiling the step is most of a run's first minute. On the bench model
(benchmarks/bench_pretrain.py --variants fp32,second-start, 2-core CPU, 2026-11-28) the first step
came 4.6 s after the start compiled and 1.3 s with the graph loaded from the cache; the
plain-MindSpore loop's 2.7 s. The 12-layer model: 18.5 s, 11.9 s and 29.9 s.

MindSpore's own graph cache (MindSpore 2.10, measured on CPU) and what RapidGPT does about it:
- It saves the frontend's result (a MindIR file) and, at the next start, loads it and runs only
  the backend's work. Parameter values are not in the file: the loaded graph is bound to the live
  parameters, so a resumed or finetuned run uses the cached graph with its own weights.
- It is switched on by MS_COMPILER_CACHE_ENABLE=1, read at every compile (with 0, nothing is
  cached).
- It files graphs as `$MS_COMPILER_CACHE_PATH/rank_<rank>/graph_cache/compile_cache_<n>.mindir`,
  n counting the process's cache-enabled compiles, and checks only a hash of the entry script and
  the non-installed files it imports. It does not know the model: a run with another --num-layers
  ran the cached graph of the previous run (wrong losses), and a GPT run given a cached BERT graph
  crashed.
- The directory is fixed at the first compile in the process that reads MS_COMPILER_CACHE_PATH:
  one with the cache on, and also one that builds fused kernels (graph kernel fusion keeps its
  kernels there). After a fused compile, a cache-enabled one files its graph under the kernel
  cache, whatever MS_COMPILER_CACHE_PATH says by then (measured: a fused jitted function, then
  the cache switched on with another path; the graph went to the kernel cache's rank_0/). That
  place has no key: in the test suite, a 4-rank job whose pipeline-parallel runs (fused, not
  cached) came before a TP=2 x DP=2 fp16 run loaded there another job's graph and stopped in
  MindSpore's runtime ("PushTupleTensor: Index out of flatten_value range").
RapidGPT therefore switches it on only around the compile of a training step that is the first
graph compiled in its process (n = 0, the directory not yet fixed), with MS_COMPILER_CACHE_PATH
pointing to a directory of its own named by a hash of what the graph is built from
(`graph_key`): MindSpore's version, the source of RapidGPT's modules and of every other
non-installed module loaded (the user's script and its helpers), the flags but those only the
host reads (HOST_SIDE_FLAGS: iteration counts, intervals, save/load paths, logging), the
model's parameters (names, shapes, dtypes), the batch's fields (names, shapes, dtypes), and the
MindSpore variables that change compilation (MS_DEV_*, MS_JIT*). Not cached: pipeline-parallel
steps (their layers compile one by one under PyNative's autograd), evaluation and generation graphs
(compiled later, in an order that depends on the run), a step compiled after another graph in the
same process (tests' batched runs, a hand-written loop with several forward functions; one line
says so), a process with no entry script file (`python -c`, an interactive session: MindSpore's
cache reads that file at every compile, and fails without it).

Kernels: MindSpore keeps compiled kernels in MS_COMPILER_CACHE_PATH as well; each rank's part of
the keyed directory (`<key>/rank_<rank>`, its MS_COMPILER_CACHE_PATH while the step compiles)
links to that rank's kernel cache's `akg_kernel_meta` and lock file, so kernels stay shared between
runs. Each rank has a kernel cache of its own (rapidgpt/config/kernel_fusion.py: why). A loaded
graph is fused in other groups than a freshly compiled one, so the first load of a graph on a
machine builds some kernels of its own (the bench model: 8.8 s instead of 1.3 s, once).

A cached graph that fails to load is compiled anew: a damaged file MindSpore replaces by itself;
one that loads but fails (a graph the key should have told apart) is deleted first. The 64 most
recently used graphs per MindSpore version are kept
(`$RAPIDGPT_CACHE_DIR/compiled_steps/mindspore-<version>/`).
"""
import glob
import hashlib
import logging
import os
import re
import shutil
import sys
import sysconfig
from dataclasses import dataclass

from rapidgpt.mindspore_logs import native_stderr_in_records

CHOICES = ("on", "off")
ENABLE_VARIABLE = "MS_COMPILER_CACHE_ENABLE"
PATH_VARIABLE = "MS_COMPILER_CACHE_PATH"
KEPT_GRAPHS = 64
# Flags only the host loop reads: a resumed run (other --train-iters, --load) finds its graph.
HOST_SIDE_FLAGS = frozenset({
    "train_iters", "train_samples", "save", "save_interval", "load", "exit_interval", "exit_duration_in_mins",
    "log_interval", "eval_interval", "eval_iters", "tensorboard_dir", "tensorboard_log_interval", "log_dir",
    "no_progress_bar", "timing_log_level", "timing_log_option", "save_retain_interval", "wandb_project", "wandb_exp_name",
    "wandb_save_dir", "wandb_entity"})
# Shared with the kernel cache (see the module docstring).
KERNEL_ENTRIES = (("akg_kernel_meta", True), ("kernel_build_tmp.key", False))

ENVIRONMENT_REFUSED = (
    f"{ENABLE_VARIABLE}=1: MindSpore's graph compile cache would then serve every graph of the process "
    f"by its compile order and entry script, not by the model, so a changed model (another --num-layers, "
    f"say) could silently run an old graph; unset {ENABLE_VARIABLE} (RapidGPT caches the training step's "
    f"graph itself, keyed by the model: --compile-cache, on by default)")


@dataclass(frozen=True)
class CompileCacheConfig:
    enabled: bool = True

    @classmethod
    def from_args(cls, args):
        return cls(args.compile_cache == "on")


def add_compile_cache_args(parser):
    g = parser.add_argument_group("compile cache", "the training step's compiled graph, kept for the next start")
    g.add_argument("--compile-cache", choices=CHOICES, default="on",
                   help="on: a second start of the same run (a resume, the same command again) loads the "
                        "compiled training step from RapidGPT's cache instead of compiling it; the cache "
                        "is keyed by the code, the flags, the model and the batch, so a changed run compiles "
                        "anew. off: always compile")


def check_compile_cache_args(args, check):
    """Set `args.compile_cache_config` (a CompileCacheConfig)."""
    args.compile_cache_config = CompileCacheConfig.from_args(args)


def check_compile_cache_environment():
    """The one-line refusal of a user's MS_COMPILER_CACHE_ENABLE, or None."""
    return ENVIRONMENT_REFUSED if os.environ.get(ENABLE_VARIABLE) == "1" else None


def describe_compile_cache(args):
    """What the start-up line says."""
    if not args.compile_cache_config.enabled:
        return "off (--compile-cache off)"
    if not args.jit:
        return "off (the step runs eagerly)"
    if args.pipeline_model_parallel_size > 1:
        return "off for pipeline-parallel steps (their layers compile one by one under PyNative's autograd)"
    return "on (the training step's graph, keyed by the code, the flags, the model and the batch)"


def _installed_prefixes():
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                 paths["stdlib"], paths["purelib"], paths["platlib"])})


def code_digest():
    """A hash of the source of RapidGPT's modules and of every loaded module that is not installed
    (the user's script, its helpers): what the compiled graph was traced from."""
    installed = _installed_prefixes()
    digest = hashlib.sha256()
    for name, module in sorted(list(sys.modules.items()), key=lambda item: item[0]):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        real = os.path.realpath(path)
        if not (name == "rapidgpt" or name.startswith("rapidgpt.")) and real.startswith(installed):
            continue
        try:
            with open(real, "rb") as source:
                digest.update(name.encode() + b"\0" + hashlib.sha256(source.read()).digest())
        except OSError:
            digest.update(name.encode() + b"\0unreadable")
    return digest.hexdigest()


def _describe(value):
    """A value's repr without memory addresses (an object counts by its type)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def tensors_signature(tree):
    """`[(path, shape, dtype)]` of the tensors in a (nested) dict/tuple/list of tensors."""
    if isinstance(tree, dict):
        return [(f"{key}/{path}", shape, dtype) for key in sorted(tree)
                for path, shape, dtype in tensors_signature(tree[key])]
    if isinstance(tree, (tuple, list)):
        return [(f"{i}/{path}", shape, dtype) for i, item in enumerate(tree)
                for path, shape, dtype in tensors_signature(item)]
    return [("", tuple(tree.shape), str(tree.dtype))]


def graph_key(args, parameters, inputs):
    """The hex key of the training step compiled for `args`, `parameters` and the batch `inputs`."""
    import mindspore as ms

    flags = sorted((name, _describe(value)) for name, value in vars(args).items() if name not in HOST_SIDE_FLAGS)
    environment = sorted((name, value) for name, value in os.environ.items()
                         if name.startswith(("MS_DEV_", "MS_JIT")))
    parts = [ms.__version__, code_digest(), flags, environment,
             [(p.name, tuple(p.shape), str(p.dtype), bool(p.requires_grad)) for p in parameters],
             tensors_signature(inputs)]
    return hashlib.sha256(repr(parts).encode("utf-8")).hexdigest()[:32]


_SWITCHED_ON_IN_THIS_PROCESS = False    # once only: even a compile that failed has fixed the directory


class StepGraphCache:
    """`first_call(call, inputs)`: run a training step's first call (its compile) with MindSpore's
    graph cache on, in the directory of its `graph_key`."""

    def __init__(self, args, parameters, rank, frozen=()):
        """`parameters`: the optimizer's; `frozen`: the names of the model's parameters that are
        not trained (requires_grad False), with which the cache is not used (see first_call)."""
        import mindspore as ms
        from rapidgpt.utils import cache_root

        self.args, self.parameters, self.rank, self.frozen = args, parameters, rank, list(frozen)
        self.root = os.path.join(cache_root(), "compiled_steps", f"mindspore-{ms.__version__}")
        self.logger = logging.getLogger("rapidgpt")

    def saved_graph(self, directory):
        """(size, modification time) of the step in this rank's `directory` (MindSpore files it in
        `rank_<rank>/graph_cache` there), or None unless the step is there whole: its graph and the
        dependency hash MindSpore writes after it (a start killed while saving leaves no hash, and
        MindSpore then compiles). A rank msrun started prefixes both names with its role, MS_WORKER."""
        files = os.path.join(glob.escape(directory), f"rank_{self.rank}", "graph_cache")
        graphs = glob.glob(os.path.join(files, "*compile_cache_0.mindir"))
        if not graphs or not glob.glob(os.path.join(files, "*compile_dependency.hash")):
            return None
        stat = os.stat(graphs[0])
        return stat.st_size, stat.st_mtime_ns

    def first_call(self, call, inputs):
        from rapidgpt.mindspore_private import graph_cache_entry_script, graphs_compiled_in_this_process
        global _SWITCHED_ON_IN_THIS_PROCESS
        if _SWITCHED_ON_IN_THIS_PROCESS or graphs_compiled_in_this_process():
            self.logger.info(" > compile cache: not used for this training step: another graph was compiled in "
                             "this process before it (MindSpore would file it by compile order, not by its key)")
            return call()
        if self.frozen:
            # Measured (MindSpore 2.10, CPU): a GPT with its position embeddings and second layer frozen,
            # started twice, printed other losses from the loaded graph (8.320328 for 8.316963 at
            # iteration 1); a distillation run's frozen teacher computed NaN.
            self.logger.info(f" > compile cache: not used for this training step: the model has frozen parameters "
                             f"({self.frozen[0]}{', ...' if len(self.frozen) > 1 else ''}), which a graph loaded "
                             f"from MindSpore's cache does not read right")
            return call()
        entry = graph_cache_entry_script()
        if entry is None or not os.path.isfile(entry):
            self.logger.info(" > compile cache: not used for this training step: MindSpore's graph cache reads "
                             "the script the process started from, and this one started from none (python -c, "
                             "an interactive session)")
            return call()
        _SWITCHED_ON_IN_THIS_PROCESS = True
        key_directory = os.path.join(self.root, graph_key(self.args, self.parameters, inputs))
        directory = os.path.join(key_directory, f"rank_{self.rank}")
        cached = self.saved_graph(directory)
        try:
            with self._switched_on(directory), native_stderr_in_records(self.rank):
                result = call()
        except Exception as error:  # noqa: BLE001 -- a cached graph that does not load is compiled
            if cached is None:
                raise
            self.logger.warning(f" > compile cache: the cached training step in {directory} did not load "
                                f"({type(error).__name__}: {error}); deleted it, compiling")
            shutil.rmtree(directory, ignore_errors=True)     # the other ranks' graphs are theirs
            return call()
        os.utime(key_directory)
        saved = self.saved_graph(directory)
        if cached and saved == cached:
            self.logger.info(f" > compile cache: training step loaded from {directory}")
        elif saved:
            # MindSpore compiles by itself when a cached graph does not load (a damaged file), and
            # saves the new graph over it.
            again = " (the cached one did not load)" if cached else ""
            self.logger.info(f" > compile cache: training step compiled and saved to {directory}{again}")
            self._prune()
        return result

    def _switched_on(self, directory):
        os.makedirs(directory, exist_ok=True)
        kernels = os.environ.get(PATH_VARIABLE)
        if kernels:
            for name, is_directory in KERNEL_ENTRIES:
                target, link = os.path.join(kernels, name), os.path.join(directory, name)
                if is_directory:
                    os.makedirs(target, exist_ok=True)
                elif not os.path.exists(target):
                    open(target, "a").close()
                try:
                    os.symlink(target, link)
                except FileExistsError:     # linked at an earlier start
                    pass
        return _Environment({ENABLE_VARIABLE: "1", PATH_VARIABLE: directory})

    def _prune(self):
        """Keep the KEPT_GRAPHS most recently used graphs."""
        try:
            entries = [os.path.join(self.root, name) for name in os.listdir(self.root)]
            entries.sort(key=os.path.getmtime, reverse=True)
        except OSError:
            return
        for stale in entries[KEPT_GRAPHS:]:
            shutil.rmtree(stale, ignore_errors=True)


class _Environment:
    """Set environment variables for a `with` block, then restore them (unset ones removed)."""

    def __init__(self, values):
        self.values, self.saved = values, {}

    def __enter__(self):
        self.saved = {name: os.environ.get(name) for name in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
