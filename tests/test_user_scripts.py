"""CLI smoke tests: the `rapidgpt` program on the black-box task and on every example in
user_scripts/, run as a user would (a subprocess), with tiny models and a few iterations.

The demo corpus is built once per test session into a temporary RAPIDGPT_CACHE_DIR.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_SCRIPTS = REPO / "user_scripts"

# 2 layers, hidden 64, sequence 32: each run compiles in a few seconds and trains in a few more.
TINY_GPT = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "32", "--no-progress-bar"]


def rapidgpt_command():
    """The venv's `rapidgpt` console script if installed, else the module."""
    script = Path(sys.executable).parent / "rapidgpt"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rapidgpt.cli"]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("rapidgpt_cache")


@pytest.fixture(scope="module")
def env(cache_dir):
    environment = dict(os.environ, RAPIDGPT_CACHE_DIR=str(cache_dir), PYTHONUNBUFFERED="1")
    environment.pop("RAPIDGPT_DEBUG", None)
    return environment


@pytest.fixture(scope="module")
def demo(env, cache_dir):
    """Paths of the demo corpus, built once in the module's cache dir (by a subprocess, so that
    this test process never depends on the cache location)."""
    code = ("from rapidgpt.data.demo_corpus import demo_corpus; p = demo_corpus(); "
            "print(p['data_prefix']); print(p['vocab_file']); print(p['merge_file'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=300).stdout.split("\n")
    prefix, vocab, merges = out[0], out[1], out[2]
    assert prefix.startswith(str(cache_dir))
    return {"data_prefix": prefix, "vocab_file": vocab, "merge_file": merges}


def tokenizer_flags(demo):
    return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", demo["vocab_file"],
            "--merge-file", demo["merge_file"]]


def run(args, env, timeout=240):
    return subprocess.run(rapidgpt_command() + list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def run_ok(args, env, **kwargs):
    result = run(args, env, **kwargs)
    assert result.returncode == 0, \
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def lm_losses(output):
    """The `lm loss` of each Megatron training log line."""
    return [float(x) for x in re.findall(r" iteration +\d+/ *\d+ \|.*? lm loss: ([0-9.E+-]+) \|", output)]


# ---- black-box task ----------------------------------------------------------------------------

def test_task_pretraining_on_demo_corpus(env, demo):
    out = run_ok(["--task", "pretraining", *TINY_GPT, "--micro-batch-size", "4", "--train-iters", "20",
                  "--log-interval", "5", "--eval-interval", "10", "--eval-iters", "2", "--lr", "2e-3",
                  "--max-new-tokens", "6"], env)
    assert re.search(r" iteration +20/ +20 \| consumed samples: +80 \|", out), out
    losses = lm_losses(out)
    assert len(losses) == 4 and losses[-1] < losses[0], out
    assert "validation loss at iteration 10 | lm loss value:" in out
    assert "lm loss PPL:" in out
    assert "validation loss at the end of training for val data" in out
    assert "prompt: 'The assert statement'" in out
    assert re.search(r"continuation \(greedy\): '.*'", out), out


# ---- user_scripts/pretrain_gpt.py --------------------------------------------------------------

def test_user_script_pretrain_gpt(env, demo):
    out = run_ok(["--user-script", str(USER_SCRIPTS / "pretrain_gpt.py"), *TINY_GPT,
                  "--data-path", demo["data_prefix"], *tokenizer_flags(demo), "--split", "90,8,2",
                  "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "12",
                  "--log-interval", "4", "--eval-interval", "6", "--eval-iters", "2", "--lr", "2e-3"], env)
    assert "> GPT datasets: train" in out
    assert re.search(r" iteration +12/ +12 \| consumed samples: +96 \|.* global batch size: +8 \|", out), out
    losses = lm_losses(out)
    assert len(losses) == 3 and losses[-1] < losses[0], out
    assert "validation loss at iteration 6 | lm loss value:" in out
    assert "validation loss at the end of training for test data" in out


def test_per_token_loss_with_whole_micro_batches_is_the_default_loss(env, demo):
    """user_scripts/pretrain_gpt.py's loss_func returns Megatron's (loss sum, tokens). With every
    token counted and one micro-batch per step, --calculate-per-token-loss gives the default's
    losses and gradient norms. (Guards the compiled per-token step: written with a conditional
    expression, MindSpore 2.10 compiled it to gradients ~8x too large, which this caught.)"""
    common = ["--user-script", str(USER_SCRIPTS / "pretrain_gpt.py"), *TINY_GPT, "--data-path", demo["data_prefix"],
              *tokenizer_flags(demo), "--micro-batch-size", "8", "--global-batch-size", "8", "--train-iters", "3",
              "--log-interval", "1", "--eval-iters", "1", "--hidden-dropout", "0", "--attention-dropout", "0"]
    values = [re.findall(r"lm loss: ([\d.E+-]+) \|.*?grad norm: ([\d.]+)", run_ok(common + extra, env))
              for extra in ([], ["--calculate-per-token-loss"])]
    assert len(values[0]) == 3 and values[0] == values[1], values


def test_user_script_pretrain_gpt_requires_data_path(env, demo):
    result = run(["--user-script", str(USER_SCRIPTS / "pretrain_gpt.py"), *TINY_GPT,
                  *tokenizer_flags(demo), "--train-iters", "2"], env)
    assert result.returncode == 2, result.stderr
    assert "--data-path PREFIX is required" in result.stderr


def test_user_script_pretrain_gpt_tensorboard_with_rapidformers_precision_and_recompute_switches(env, demo, tmp_path):
    tb = tmp_path / "tb"
    out = run_ok(["--user-script", str(USER_SCRIPTS / "pretrain_gpt.py"), *TINY_GPT,
                  "--data-path", demo["data_prefix"], *tokenizer_flags(demo),
                  "--micro-batch-size", "4", "--train-iters", "4", "--log-interval", "2",
                  "--eval-interval", "2", "--eval-iters", "1", "--tensorboard-dir", str(tb),
                  "--mixed-precision", "--initial-loss-scale", "4096", "--checkpoint-activations"], env)
    assert "precision: fp16 parameters and activations" in out and "recompute: full, uniform, 1 layer(s)" in out
    assert re.search(r"lm loss: [\d.E+-]+ \| loss scale: 4096\.0 \|", out), out
    events = b"".join(path.read_bytes() for path in tb.glob("events.out.tfevents.*"))   # a later scalar reopens
    assert events, list(tb.iterdir()) if tb.exists() else "no dir"                     # (a new file)
    assert b"loss-scale" in events and b"grad-norm" in events


# ---- README.md's white-box examples: user_scripts/minimal_pretrainer.py, minimal_finetuner.py ----

README_SCRIPTS = ["user_scripts/minimal_finetuner.py", "user_scripts/minimal_pretrainer.py"]


def readme_script_blocks():
    """{path: code} of README.md's ```python blocks that open with `# user_scripts/NAME.py`."""
    blocks = re.findall(r"^```python\n(# (user_scripts/[\w.]+\.py)\b.*?)^```$", (REPO / "README.md").read_text(),
                        re.S | re.M)
    return {path: code for code, path in blocks}


def readme_pretrainer_flags(demo):
    return ["--user-script", "user_scripts/minimal_pretrainer.py", *TINY_GPT, "--data-path", demo["data_prefix"],
            *tokenizer_flags(demo), "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "12",
            "--log-interval", "4", "--eval-interval", "6", "--eval-iters", "2", "--lr", "2e-3"]


README_FINETUNER = ["--user-script", "user_scripts/minimal_finetuner.py", "--micro-batch-size", "32",
                    "--epochs", "2", "--lr", "1e-2", "--log-interval", "8", "--no-progress-bar"]


@pytest.fixture(scope="module")
def readme_runs(env, demo, tmp_path_factory):
    """`readme_runs(argv) -> output`: the README's two example files run by the CLI, both in one
    process (tests/batched_runs.py: MindSpore is imported once for the two)."""
    from batched_runs import BatchedRuns
    planned = [(1, readme_pretrainer_flags(demo)), (1, README_FINETUNER)]
    batched = BatchedRuns(env, tmp_path_factory.mktemp("readme_runs"), planned)

    def run(argv):
        status, output, _ = batched(1, argv)
        assert status == 0, output[-3000:]
        return output
    return run


def test_readme_white_box_examples_are_the_files_in_user_scripts():
    """The README shows these files whole, so the runs below run what a user pastes."""
    blocks = readme_script_blocks()
    assert sorted(blocks) == README_SCRIPTS
    for path, code in blocks.items():
        assert code == (REPO / path).read_text(), f"README.md's {path} differs from the file"


def test_readme_pretrainer_trains_on_the_gpt_data(readme_runs, demo):
    out = readme_runs(readme_pretrainer_flags(demo))
    assert re.search(r" iteration +12/ +12 \| consumed samples: +96 \|", out), out
    losses = lm_losses(out)
    assert len(losses) == 3 and losses[-1] < losses[0], out
    assert "validation loss at iteration 6 | lm loss value:" in out


def test_readme_finetuner_trains_its_own_model(readme_runs):
    out = readme_runs(README_FINETUNER)
    losses = [float(x) for x in re.findall(r" iteration +\d+/ *\d+ \|.*? loss: ([0-9.E+-]+) \|", out)]
    assert len(losses) == 8 and losses[-1] < losses[0] / 2, out        # 2 epochs of 1024 / 32 = 32 steps
    accuracies = [float(a) for a in re.findall(r"validation at epoch \d \(iteration \d+\) \| accuracy: ([0-9.]+)", out)]
    assert len(accuracies) == 2 and accuracies[-1] > 0.6, out         # chance: 1/8


# ---- user_scripts/finetune_classification.py ---------------------------------------------------

def test_user_script_finetune_classification(env, demo):
    out = run_ok(["--user-script", str(USER_SCRIPTS / "finetune_classification.py"), *TINY_GPT,
                  *tokenizer_flags(demo), "--num-classes", "3", "--train-size", "512",
                  "--valid-size", "128", "--micro-batch-size", "16", "--epochs", "2", "--lr", "2e-3",
                  "--log-interval", "16"], env)
    accuracies = [float(x) for x in
                  re.findall(r"validation at epoch \d+ \(iteration \d+\) \| accuracy: ([0-9.]+)", out)]
    assert len(accuracies) == 2, out
    assert accuracies[-1] > 0.6, out          # chance is 1/3
    assert "final validation accuracy" in out


def test_user_script_finetune_classification_on_files_from_a_pretrained_checkpoint(env, demo, tmp_path):
    pretrained = str(tmp_path / "pretrained")
    run_ok(["--task", "pretraining", *TINY_GPT, "--micro-batch-size", "4", "--train-iters", "4",
            "--eval-iters", "0", "--max-new-tokens", "0", "--save", pretrained], env)
    for name, size in (("train", 64), ("valid", 32)):
        rows = [f"{i}\tthe review\t{'good fine' if i % 2 else 'bad awful'} film\t{'pos' if i % 2 else 'neg'}"
                for i in range(size)]
        (tmp_path / f"{name}.tsv").write_text("id\ttext_a\ttext_b\tlabel\n" + "\n".join(rows) + "\n")
    out = run_ok(["--user-script", str(USER_SCRIPTS / "finetune_classification.py"), "--no-progress-bar",
                  "--pretrained-checkpoint", pretrained, "--data-path", str(tmp_path / "train.tsv"),
                  "--valid-data-path", str(tmp_path / "valid.tsv"), "--micro-batch-size", "16",
                  "--epochs", "1", "--lr", "2e-3"], env)
    assert "labels 0=neg, 1=pos" in out
    assert "into 'backbone.'" in out and "newly initialised (not in the checkpoint): head.bias, head.weight" in out
    assert re.search(r"validation at epoch 1 \(iteration 4\) \| accuracy: [0-9.]+ \| f1: [0-9.]+ \|", out), out
    assert "final validation accuracy" in out and "(chance 0.500)" in out


# ---- user_scripts/custom_loop.py ---------------------------------------------------------------

def test_user_script_custom_loop(env, demo):
    out = run_ok(["--user-script", str(USER_SCRIPTS / "custom_loop.py"), *TINY_GPT,
                  "--micro-batch-size", "8", "--train-iters", "30", "--lr", "3e-3", "--log-interval", "10"],
                 env)
    losses = [float(x) for x in re.findall(r"step +\d+ \| loss ([0-9.]+) \|", out)]
    assert len(losses) == 3, out
    assert losses[-1] < losses[0] - 0.5, out


@pytest.mark.ranks
def test_custom_loop_on_two_ranks_with_zero_3_is_the_single_process_loop(env, demo, tmp_path):
    """engine.compose under msrun with ZeRO-3 (parameters, gradients and Adam state sharded over
    DP=2; ZeRO-1/2 go through the same wrap_optimizer as the trainers' and are tested there). The
    hand-written loop gives every rank the same batches (it does not split its data by rank), so
    with dropout off DP=2 averages two equal gradients: the single-process run of those batches."""
    flags = ["--user-script", str(USER_SCRIPTS / "custom_loop.py"), *TINY_GPT, "--train-iters", "6",
             "--lr", "3e-3", "--log-interval", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
             "--global-batch-size", "16"]
    step = re.compile(r"step +\d+ \| loss ([0-9.]+) \| lr [0-9.e+-]+ \| grad norm ([0-9.]+)")
    reference = step.findall(run_ok(flags + ["--micro-batch-size", "16"], env))
    assert len(reference) == 6
    result = run(flags + ["--micro-batch-size", "8", "--nproc-per-node", "2", "--zero-3-memory-optimization",
                          "--log-dir", str(tmp_path)], env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert step.findall(result.stdout) == reference
    assert "(ZeRO stage 3: 1/2 of each layer's parameters)" in result.stdout + result.stderr


# ---- command-line errors -----------------------------------------------------------------------

def test_missing_user_script_file(env, tmp_path):
    missing = tmp_path / "no_such_trainer.py"
    result = run(["--user-script", str(missing)], env, timeout=120)
    assert result.returncode == 2
    assert f"rapidgpt: error: --user-script: {missing}: no such file" in result.stderr


def test_neither_task_nor_user_script(env):
    result = run(["--num-layers", "2"], env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: rapidgpt --task {") and len(result.stderr.splitlines()) == 4
    assert "rapidgpt: error: give --task NAME or --user-script FILE" in result.stderr


def test_classification_data_error_is_one_line(env, demo, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "a b", "label": 0}\n{"text": "c d"}\n')
    result = run(["--task", "sequence_classification", *TINY_GPT, *tokenizer_flags(demo), "--data-path",
                  str(train), "--epochs", "1"], env, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"rapidgpt: error: {train}:2: no 'label' field" in result.stderr


def test_implementation_choices_are_accepted_with_one_line_each():
    """Megatron's implementation-choice flags parse and each gets one start-up line (no MindSpore
    needed to check them)."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.config.implementation_choices import CHOICES, implementation_choice_lines
    args = parse_args(argv=["--train-iters", "1", "--use-mcore-models", "--transformer-impl", "transformer_engine",
                            "--attention-backend", "flash", "--cross-entropy-loss-fusion", "--manual-gc",
                            "--empty-unused-memory-level", "1", "--distributed-backend", "nccl",
                            "--overlap-grad-reduce", "--overlap-param-gather", "--openai-gelu", "--onnx-runtime-training",
                            "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--profile",
                            "--profile-step-start", "4", "--profile-step-end", "6", "--ckpt-format", "torch_dist",
                            "--context-parallel-size", "1"])
    lines = implementation_choice_lines(args)
    assert [line.split(":")[0] for line in lines] == [f" > {flag}" for flag in CHOICES] + [" > --ckpt-format torch_dist"]
    assert args.ckpt_format == "ckpt"                 # what is written: RapidGPT's own checkpoint files
    assert parse_args(argv=["--train-iters", "1", "--ckpt-format", "torch"]).ckpt_format == "ckpt"
    assert implementation_choice_lines(parse_args(argv=["--train-iters", "1"])) == []


def test_context_parallelism_is_refused_with_the_reason():
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(["--train-iters", "1", "--context-parallel-size", "2"]))
    assert any(line.startswith("--context-parallel-size: 2 is refused: context parallelism") for line in
               error.value.problems)
