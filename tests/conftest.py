import os, sys

# Test oracles (megatron_reference.py) are imported as plain modules.
sys.path.insert(0, os.path.dirname(__file__))

import importlib

import pytest

# First, as in a user's run: importing rapidgpt sets OMP_WAIT_POLICY before MindSpore loads.
importlib.import_module("rapidgpt")


@pytest.fixture(autouse=True)
def graph_kernel_fusion_off_as_each_test_starts():
    """Each test starts with MindSpore's graph kernel fusion off, as a fresh process has it: an
    engine switches it on for its run (rapidgpt/config/kernel_fusion.py, through
    MS_DEV_GRAPH_KERNEL_FLAGS), an engine of a module-scoped fixture before the module's first test,
    and a later test that compiles a step of its own in the same process would otherwise fuse it too.
    (Measured: a unit test's fp16 step, fused after an engine's run in the same xdist worker, stopped
    MindSpore 2.10's kernel compiler, AKG, on a Cast it does not build; every later compile of that
    worker failed, and one hung.) A test's own engine switches it on again."""
    from rapidgpt.config.kernel_fusion import FLAGS_VARIABLE
    flags = [flag for flag in os.environ.get(FLAGS_VARIABLE, "").split() if not flag.startswith("--opt_level=")]
    if flags:
        os.environ[FLAGS_VARIABLE] = " ".join(flags)
    else:
        os.environ.pop(FLAGS_VARIABLE, None)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory):
    """A fresh RAPIDGPT_CACHE_DIR for the tests that train in this process: the demo corpus is
    built into it once per session."""
    previous = os.environ.get("RAPIDGPT_CACHE_DIR")
    os.environ["RAPIDGPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if previous is None:
        os.environ.pop("RAPIDGPT_CACHE_DIR", None)
    else:
        os.environ["RAPIDGPT_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    """The environment of the CLI runs the tests start: their own dataset cache, unbuffered output,
    this interpreter's bin/ (msrun) first on PATH."""
    return dict(os.environ, RAPIDGPT_CACHE_DIR=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1",
                PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def _tiny_runs(env, tmp_path_factory, request, attribute):
    """`run(nproc, tp, *flags)`: tests/test_parallel.py's TINY run on that layout with `flags`,
    saving every 6 iterations, done once per test session; the runs that the collected modules
    declare in `attribute` of one size go in one job (tests/batched_runs.py) -> (its printed values
    with TensorBoard's grad norms, its --save folder, its log)."""
    from batched_runs import BatchedRuns, declared_runs, tensorboard_of
    from test_parallel import skipped, tiny_run, values
    batched = BatchedRuns(env, tmp_path_factory.mktemp(attribute.lower()),
                          [tiny_run(*key) for key in declared_runs(request, attribute)])

    def run(nproc, tp, *flags):
        status, log, save = batched(*tiny_run(nproc, tp, *flags))
        assert status == 0, log[-3000:]
        found = values(log, tensorboard_of(save))
        assert len(found) == 2 * (12 - len(skipped(log))) + 3, log[-2000:]   # (loss, norm) per update, 3 validations
        return found, save, log
    return run


@pytest.fixture(scope="session")
def runs(env, tmp_path_factory, request):
    """The GPT's TINY runs that modules declare in TINY_RUNS (a session fixture lives here so that
    there is one for every module that asks)."""
    return _tiny_runs(env, tmp_path_factory, request, "TINY_RUNS")


@pytest.fixture(scope="session")
def llama_runs(env, tmp_path_factory, request):
    """The Llama-style TINY runs (LLAMA_RUNS) in jobs of their own: in the fresh-clone suite,
    MindSpore 2.10's kernel compiler (AKG) twice failed on one rank of a 4-rank job that had
    compiled Llama graphs before (once at the next Llama run, once at the GPT run after them:
    a fused Cast it could not build), which stopped every later run of the job. The GPT's jobs,
    alone, never failed that way."""
    return _tiny_runs(env, tmp_path_factory, request, "LLAMA_RUNS")


@pytest.fixture(scope="session")
def sft_runs(env, tmp_path_factory, request):
    """The instruction-finetuning TINY runs (tests/test_sft_runs.py's SFT_RUNS)."""
    return _tiny_runs(env, tmp_path_factory, request, "SFT_RUNS")


# The suite runs in two pytest-xdist workers (`make test`: -n 2 --dist loadgroup) on a 2-core
# machine. Tests that start several processes (msrun jobs) run one after another in one worker, in
# the group "ranks": two jobs at once would share the cores between up to 12 processes, and each
# job's ranks would then compile at very different speeds. Every other test module is a group of
# its own (its module fixtures are set up once, in one worker), and these modules run in the
# second worker beside the jobs: one process each, about one core, the core a job leaves idle
# (measured: a single-process module kept 0.92 cores busy, a module of 4-rank jobs 1.7 of 2).
# Run without -n, the same tests run in one process, the jobs first.
MULTI_PROCESS_FIXTURES = {"runs", "llama_runs", "sft_runs", "pipeline_runs", "bert_runs", "mlp_runs", "job"}


def pytest_configure(config):
    config.addinivalue_line("markers", "ranks: the test starts an msrun job of its own (several processes)")
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple >= (9, 2):
        raise pytest.UsageError("pytest >= 9.2 breaks pytest-xdist's --dist loadgroup (every msrun job could "
                                "run twice, at once): pip install 'pytest<9.2' (setup.py's test extra)")


@pytest.hookimpl(tryfirst=True)            # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    ranks = [item for item in items
             if MULTI_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("ranks")]
    chosen = set(ranks)
    others = [item for item in items if item not in chosen]
    for item in ranks:
        item.add_marker(pytest.mark.xdist_group("ranks"))
    for item in others:
        item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
    items[:] = ranks + others           # the longest group first: the worker that takes it starts at once


_MODULE_SECONDS = {}


def pytest_runtest_logreport(report):
    """Each test's setup, call and teardown time, summed per test module (a shared fixture's time
    counts for the module of the first test that asks for it)."""
    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _MODULE_SECONDS:
        return
    # With -n 2 two workers run tests at once: the sum is more than the wall time (pytest's last line).
    terminalreporter.section("time per test module")
    for module, seconds in sorted(_MODULE_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {module}")
    terminalreporter.write_line(f"{sum(_MODULE_SECONDS.values()):8.1f} s  in all")
