"""Megatron's W&B flags (rapidgpt/config/wandb_logging.py): the run W&B gets is opened as Megatron
opens it and receives every scalar TensorBoard gets, at the same iterations. The `wandb` library is
an optional extra and not installed for the suite: a stand-in module records what RapidGPT asks of
it (the library's own behaviour is W&B's)."""
import importlib.machinery
import importlib.util
import sys
import types

import numpy as np
import pytest

from rapidgpt.arguments import ArgumentError, build_parser, validate_args
from rapidgpt.global_vars import get_tensorboard_writer
from rapidgpt.tasks.pretraining import main as pretrain_main
from tensorboard_events import all_scalars

pytestmark = pytest.mark.usefixtures("demo_cache")          # tests/conftest.py
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--log-interval", "1",
        "--eval-interval", "3", "--eval-iters", "1", "--no-progress-bar", "--max-new-tokens", "0",
        "--train-iters", "4", "--log-params-norm"]


class StandInRun:
    def __init__(self, **options):
        self.options, self.logged, self.finished = options, {}, False

    def log(self, data, step):
        assert not self.finished
        for tag, value in data.items():
            self.logged.setdefault(tag, {})[step] = value

    def finish(self):
        self.finished = True


@pytest.fixture
def wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)         # found by the flag check
    module.runs = []
    module.init = lambda **options: module.runs.append(StandInRun(**options)) or module.runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_the_wandb_run_gets_every_tensorboard_scalar(wandb, tmp_path):
    save = tmp_path / "ckpt"
    assert pretrain_main([*TINY, "--tensorboard-dir", str(tmp_path / "tb"), "--save", str(save),
                          "--wandb-project", "tiny", "--wandb-exp-name", "run-1", "--wandb-entity", "team"]) == 0
    [run] = wandb.runs
    assert {k: run.options[k] for k in ("project", "name", "entity", "dir")} == \
        {"project": "tiny", "name": "run-1", "entity": "team", "dir": str(save / "wandb")}
    assert run.options["config"]["hidden_size"] == 32 and run.options["config"]["wandb_project"] == "tiny"
    get_tensorboard_writer().close()          # the final validation's scalars are queued until exit (or close)
    tensorboard = all_scalars(tmp_path / "tb")
    assert {"lm_loss", "grad-norm", "params-norm", "learning-rate", "lm_loss_validation"} <= set(tensorboard)
    logged = {tag.replace(" ", "_"): values for tag, values in run.logged.items()}   # tensorboardX's tag names
    assert sorted(logged) == sorted(tensorboard)
    for tag, values in tensorboard.items():          # TensorBoard holds float32s
        assert sorted(logged[tag]) == sorted(values), tag
        np.testing.assert_allclose([logged[tag][step] for step in sorted(values)],
                                   [values[step] for step in sorted(values)], rtol=1e-6, err_msg=tag)
    assert pretrain_main([*TINY, "--wandb-project", "tiny", "--wandb-save-dir", str(tmp_path / "w")]) == 0
    assert run.finished and wandb.runs[1].options["dir"] == str(tmp_path / "w") and "lm loss" in wandb.runs[1].logged


@pytest.mark.parametrize("flags, message", [
    (["--wandb-exp-name", "x"], "--wandb-exp-name: sets up W&B logging; give --wandb-project too, or remove it"),
    (["--wandb-project", "p"], "--wandb-project: W&B logging needs the wandb package: pip install wandb"),
])
def test_wandb_flags_are_checked_with_one_line(monkeypatch, flags, message):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args([*TINY, *flags]))
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems
