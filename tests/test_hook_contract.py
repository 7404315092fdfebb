"""Hook mistakes become one message naming the hook and what it must return (not MindSpore compile
errors or a bare StopIteration), and a failed compile leaves no analyze_fail.ir in the working
directory."""
import os
import subprocess
import sys

import numpy as np
import pytest
from mindspore import Tensor

from rapidgpt.engine import RapidGPTEngine
from rapidgpt.flag_parser import ArgumentError
from rapidgpt.models.gpt import build_gpt_model
from rapidgpt.training.hook_contract import HookContractError, forward_output_problem
from rapidgpt.training.pretrainer import Pretrainer, next_batch

TINY = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
        "--vocab-size", "20", "--micro-batch-size", "2", "--no-progress-bar", "--train-iters", "2",
        "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0"]


class Tokens:
    """A map-style dataset of `size` GPT samples."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        tokens = (np.arange(9) + i) % 20
        return {"tokens": tokens[:-1].astype(np.int32), "labels": tokens[1:].astype(np.int32),
                "loss_mask": np.ones(8, np.float32), "position_ids": np.arange(8, dtype=np.int32)}


def pretrainer(forward, size=64, datasets=None):
    class User(Pretrainer):
        def train_valid_test_datasets_provider(self, num_samples):
            return datasets if datasets is not None else (Tokens(size), None, None)

        def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True):
            return build_gpt_model(self.args, 20), None, None

        def run_forward_step(self, data_iterator, model):
            return forward(data_iterator, model)

    return User


def losses(batch, model):
    return model(batch["tokens"], batch["position_ids"], None, batch["labels"])       # [b, s]


@pytest.mark.parametrize("forward,message", [
    (lambda it, model: model(next_batch(it)["tokens"]),
     "run_forward_step returned a tensor of shape [2, 8, 20], not a scalar loss (logits?)"),
    (lambda it, model: (model(next_batch(it)["tokens"]), losses(next_batch(it), model).mean()),
     "run_forward_step returned a tuple (Tensor, Tensor); return the scalar loss, or Megatron's (output, loss_fn)"),
    (lambda it, model: losses(next(it), model).mean(),
     "run_forward_step calls next(data_iterator), but inside the compiled step it receives the micro-batch "
     "itself; use rapidgpt.next_batch(data_iterator)"),
])
def test_forward_hook_mistakes_are_named(forward, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = RapidGPTEngine(argv=TINY)
    with pytest.raises(HookContractError) as e:
        pretrainer(forward)(engine).train()
    assert message in str(e.value)
    assert not os.path.exists(tmp_path / "rank_0"), "analyze_fail.ir left in the working directory"


def test_a_correct_forward_passes_the_check():
    assert forward_output_problem(Tensor(np.float32(1.0))) is None
    assert forward_output_problem((Tensor(np.ones(2, np.float32)), lambda out: out.sum())) is None
    assert "returned NoneType" in forward_output_problem(None)


def test_dataset_provider_count_and_length_are_checked_before_training():
    engine = RapidGPTEngine(argv=TINY)
    forward = lambda it, model: losses(next_batch(it), model).mean()        # noqa: E731
    with pytest.raises(HookContractError, match=r"train_valid_test_datasets_provider returned 2 values; it "
                                                r"must return \(train, valid, test\)"):
        pretrainer(forward, datasets=(Tokens(64), None))(engine).train()
    with pytest.raises(HookContractError, match="returned a training dataset of 3 samples, but this run draws 4 "
                                                r"from it \(--train-iters 2 x --global-batch-size 2\)"):
        pretrainer(forward, size=3)(engine).train()


def test_compose_without_train_iters_says_which_flag():
    at = TINY.index("--train-iters")
    engine = RapidGPTEngine(argv=TINY[:at] + TINY[at + 2:])
    with pytest.raises(ArgumentError, match="--train-iters: engine.compose builds the LR schedule"):
        engine.compose(build_gpt_model(engine.args, 20))


def test_user_script_with_a_syntax_error_shows_its_line(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("from rapidgpt import Pretrainer\n\nclass P(Pretrainer:\n    pass\n")
    result = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--user-script", str(script)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"rapidgpt: error: --user-script: {script}:3:" in result.stderr
    assert "class P(Pretrainer:" in result.stderr
