"""The compile cache (rapidgpt/config/compile_cache.py): a second start of the same run loads the
training step's graph, and only the same run does.

The key: stable under the flags only the host reads (a resume with another --train-iters or
--load), changed by a model flag, a parameter's shape, the batch's shape, the code. End to end, in
fresh processes sharing one cache: the first run compiles and saves its step; a resume of it
loads the step and prints exactly the uninterrupted run's losses, grad norms and validation
losses, with no MindSpore record on the terminal; a 3-layer run beside the 2-layer one compiles
its own step; a damaged cached graph is compiled again; a step compiled after another graph in
its process is not cached. A second start at TP=2 (msrun's ranks) loads each rank's step. A
user's MS_COMPILER_CACHE_ENABLE=1 (MindSpore's unkeyed cache) is refused in one line.
"""
import re
import sys
import types
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from rapidgpt.arguments import build_parser
from rapidgpt.config import compile_cache
from rapidgpt.config.compile_cache import HOST_SIDE_FLAGS, graph_key
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.flag_parser import ArgumentError
from test_parallel import TINY, checkpoint_of, single, values


class FakeParameter:
    def __init__(self, name, shape):
        self.name, self.shape, self.dtype, self.requires_grad = name, shape, "Float32", True


ARGS = dict(num_layers=2, hidden_size=32, seed=3, train_iters=12, load=None, save="/ckpt", log_interval=1)
PARAMETERS = [FakeParameter("embedding.weight", (96, 32)), FakeParameter("layers.0.weight", (32, 32))]
BATCH = {"tokens": np.zeros((4, 2, 17), np.int32), "loss_mask": np.zeros((4, 2, 16), np.float32)}


def key(args=None, parameters=PARAMETERS, batch=None):
    return graph_key(Namespace(**{**ARGS, **(args or {})}), parameters, BATCH if batch is None else batch)


def test_the_key_ignores_the_flags_only_the_host_reads():
    assert key({"train_iters": 24, "load": "/ckpt", "save": "/elsewhere", "log_interval": 10}) == key()


@pytest.mark.parametrize("change", ["flag", "seed", "parameter", "batch"])
def test_the_key_changes_with_what_the_graph_is_built_from(change):
    changed = {
        "flag": lambda: key({"num_layers": 3}),
        "seed": lambda: key({"seed": 4}),         # the dropout streams are graph constants
        "parameter": lambda: key(parameters=[PARAMETERS[0], FakeParameter("layers.0.weight", (32, 64))]),
        "batch": lambda: key(batch={**BATCH, "tokens": np.zeros((4, 2, 33), np.int32)}),
    }[change]()
    assert changed != key()


def test_the_key_changes_with_the_users_code(tmp_path, monkeypatch):
    """A module loaded from outside the installed packages (a user's script) is part of the key."""
    script = tmp_path / "my_trainer.py"
    script.write_text("LAYERS = 2\n")
    module = types.ModuleType("my_trainer")
    module.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "my_trainer", module)
    before = key()
    script.write_text("LAYERS = 3\n")
    assert key() != before


def test_host_side_flags_are_rapidgpt_flags():
    dests = {action.dest for action in build_parser()._actions}
    assert HOST_SIDE_FLAGS <= dests, HOST_SIDE_FLAGS - dests


@pytest.mark.parametrize("value", ["1", "0"])
def test_mindspores_unkeyed_graph_cache_is_refused_in_one_line(monkeypatch, value):
    """MS_COMPILER_CACHE_ENABLE=1 would serve every graph by compile order and entry script (a
    cached graph of another model); 0 is MindSpore's off and passes."""
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", value)
    if value == "0":
        assert compile_cache.check_compile_cache_environment() is None
        return
    with pytest.raises(ArgumentError, match=r"^MS_COMPILER_CACHE_ENABLE=1: MindSpore's graph compile cache would "
                                            r"then serve every graph .* unset MS_COMPILER_CACHE_ENABLE \(RapidGPT "
                                            r"caches the training step's graph itself"):
        RapidGPTEngine(argv=TINY)


def test_a_step_compiled_after_another_graph_is_not_cached(tmp_path, monkeypatch):
    """MindSpore fixes its graph cache's directory at the process's first compile that reads
    MS_COMPILER_CACHE_PATH (a fused one too): a step compiled after another graph would be filed
    there by compile order, not under its key, and a later process could load another run's
    graph. So that step is compiled without the cache, and one line says why."""
    import mindspore as ms

    @ms.jit
    def other_graph(x):
        return x * 2 + 1

    other_graph(ms.Tensor(np.ones(3, np.float32)))
    monkeypatch.delenv("MS_COMPILER_CACHE_ENABLE", raising=False)
    assert_compiled_uncached(tmp_path, monkeypatch, " > compile cache: not used for this training step: another "
                             "graph was compiled in this process before it (MindSpore would file it by compile "
                             "order, not by its key)")


def assert_compiled_uncached(tmp_path, monkeypatch, line, frozen=()):
    """A step's first call runs it, says `line` alone and leaves the cache directory unmade."""
    monkeypatch.setenv("RAPIDGPT_CACHE_DIR", str(tmp_path))
    cache = compile_cache.StepGraphCache(Namespace(**ARGS), PARAMETERS, rank=0, frozen=frozen)
    said = []
    cache.logger = types.SimpleNamespace(info=said.append, warning=said.append)
    assert cache.first_call(lambda: "the step ran", BATCH) == "the step ran"
    assert said == [line]
    assert not (tmp_path / "compiled_steps").exists()


def test_a_model_with_frozen_parameters_compiles_without_the_cache(tmp_path, monkeypatch):
    """A graph MindSpore 2.10 loads from its cache misreads frozen parameters (a GPT with frozen position
    embeddings and second layer printed other losses when started again; a distillation teacher, NaN):
    such a step compiles without the cache, said in one line, whatever else would allow it."""
    from rapidgpt import mindspore_private
    monkeypatch.setattr(mindspore_private, "graphs_compiled_in_this_process", lambda: False)
    monkeypatch.setattr(compile_cache, "_SWITCHED_ON_IN_THIS_PROCESS", False)
    assert_compiled_uncached(tmp_path, monkeypatch, " > compile cache: not used for this training step: the model has "
                             "frozen parameters (kd_teacher.layers.0.mlp.dense_h_to_4h.weight, ...), which a graph "
                             "loaded from MindSpore's cache does not read right",
                             frozen=["kd_teacher.layers.0.mlp.dense_h_to_4h.weight", "kd_teacher.final_layernorm.weight"])
    assert not compile_cache._SWITCHED_ON_IN_THIS_PROCESS


def test_a_process_with_no_entry_script_file_compiles_without_the_cache(tmp_path, monkeypatch):
    """MindSpore's graph cache opens the script the process started from at every cache-enabled
    compile; a process started by `python -c` (pytest-xdist's workers too) has the "file" -c, and
    the compile failed with FileNotFoundError. Such a step compiles without the cache, said in one
    line."""
    from rapidgpt import mindspore_private
    monkeypatch.setattr(mindspore_private, "graphs_compiled_in_this_process", lambda: False)
    monkeypatch.setattr(mindspore_private, "graph_cache_entry_script", lambda: str(tmp_path / "-c"))
    monkeypatch.setattr(compile_cache, "_SWITCHED_ON_IN_THIS_PROCESS", False)
    assert_compiled_uncached(tmp_path, monkeypatch, " > compile cache: not used for this training step: MindSpore's "
                             "graph cache reads the script the process started from, and this one started from "
                             "none (python -c, an interactive session)")


def test_a_second_start_loads_the_step_and_trains_exactly_as_the_first(env, tmp_path):
    run = TINY + ["--train-iters", "6", "--save-interval", "3", "--save", str(tmp_path / "first")]
    status, first = single(run, env)
    assert status == 0, first[-3000:]
    assert " > compile cache: training step compiled and saved to " in first, first[-3000:]
    expected = values(first)
    assert len(expected) == 2 * 6 + 2, first[-2000:]              # (loss, norm) per iteration, 2 validations

    resumed = TINY + ["--train-iters", "6", "--load", checkpoint_of(tmp_path / "first", 3, tmp_path / "at3")]
    status, second = single(resumed, env)
    assert status == 0, second[-3000:]
    assert " > compile cache: training step loaded from " in second, second[-3000:]
    assert values(second) == expected[6:], second[-2000:]           # iterations 4-6 and both validations
    noise = [line for line in second.splitlines() if line.startswith(("[WARNING]", "[ERROR]"))]
    assert noise == [], noise

    three_layers = TINY + ["--train-iters", "2", "--num-layers", "3", "--eval-iters", "0"]
    status, other = single(three_layers, env)
    assert status == 0, other[-3000:]
    saved = re.search(r" > compile cache: training step compiled and saved to (\S+)$", other, re.M)
    assert saved, other[-3000:]

    # A damaged cached graph (a disk full while saving, say) is compiled anew, and said so.
    graph, = Path(saved.group(1)).glob("rank_0/graph_cache/*compile_cache_0.mindir")
    graph.chmod(0o600)
    graph.write_bytes(graph.read_bytes()[:1000])
    status, again = single(three_layers, env)
    assert status == 0, again[-3000:]
    assert (f" > compile cache: training step compiled and saved to {saved.group(1)} (the cached one did not "
            f"load)") in again, again[-3000:]
    assert values(again) == values(other), again[-2000:]



@pytest.mark.ranks
def test_a_second_start_of_a_two_rank_run_loads_each_ranks_step(env, tmp_path):
    """On ranks msrun started (MindSpore names their cached graphs by role, MS_WORKER...), at TP=2:
    the second start loads both ranks' steps and prints exactly what the first printed. Each rank
    compiles (or loads) its step, then the ranks meet, then the step runs; so the evaluation step."""
    run = TINY + ["--train-iters", "3", "--eval-iters", "1", "--nproc-per-node", "2",
                  "--tensor-model-parallel-size", "2"]
    status, first = single(run + ["--log-dir", str(tmp_path / "first")], env)
    assert status == 0, first[-3000:]
    assert " > compile cache: training step compiled and saved to " in first, first[-3000:]
    status, second = single(run + ["--log-dir", str(tmp_path / "second")], env)
    assert status == 0, second[-3000:]
    assert " > compile cache: training step loaded from " in second, second[-3000:]
    for log in (first, second):     # compiled, then the ranks met, then the step ran; so the evaluation
        assert re.search(r" > training step compiled on every rank \(this rank waited [\d.]+ s for the others\)\n"
                         r"(?:.*\n)* iteration +1/(?:.*\n)* > evaluation step compiled on every rank \(this rank "
                         r"waited [\d.]+ s for the others\)\n(?:.*\n)* validation loss", log), log[-3000:]
    assert len(values(first)) == 2 * 3 + 1 and values(second) == values(first), second[-2000:]
    for rank in (0, 1):     # every rank loaded its own graph (the ranks' RapidGPT logs)
        log = (tmp_path / "second" / f"rank_{rank}.log").read_text()
        assert " > compile cache: training step loaded from " in log, log[-2000:]
