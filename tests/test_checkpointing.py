"""Checkpoints: exact resume, crash safety, fallback to the last complete one, flag checks."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapidgpt.arguments import ArgumentError, build_parser, given_flags, apply_checkpoint_args
from rapidgpt.tasks.pretraining import main as pretrain_main
from rapidgpt.tasks.text_generation import main as generation_main
from rapidgpt.training.checkpoint_files import LATEST, checkpoint_problem, find_checkpoint, iteration_dir
from tensorboard_events import scalars

# Dropout on: its masks are a function of (seed, iteration, micro-batch, cell, position), so a
# resumed run repeats them.
TINY = ["--task", "pretraining", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
        "--lr-warmup-iters", "2", "--log-interval", "1", "--eval-interval", "4", "--eval-iters", "1",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--no-progress-bar", "--max-new-tokens", "0"]
LOSS_LINE = re.compile(r" iteration\s+(\d+)/.*?\| lm loss: ([\d.E+-]+) \|.*grad norm: ([\d.]+)")


pytestmark = pytest.mark.usefixtures("demo_cache")          # tests/conftest.py


def run(capsys, *argv):
    assert pretrain_main(TINY + list(argv)) == 0
    out = capsys.readouterr().out
    return {int(m.group(1)): (m.group(2), m.group(3)) for m in LOSS_LINE.finditer(out)}, out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, demo_cache):
    """A --save folder holding checkpoints 2 and 4 of a 4-iteration run, trained once for the tests
    that damage, load or evaluate a checkpoint (those that change the folder take a copy: `copy_of`)."""
    save = tmp_path_factory.mktemp("trained") / "ckpt"
    assert pretrain_main(TINY + ["--train-iters", "4", "--save", str(save), "--save-interval", "2"]) == 0
    return save


def copy_of(trained, tmp_path):
    shutil.copytree(trained, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_resume_continues_the_uninterrupted_run_exactly(tmp_path, capsys):
    full, _ = run(capsys, "--train-iters", "8", "--seed", "3", "--tensorboard-dir", str(tmp_path / "full"))
    save = str(tmp_path / "ckpt")
    first, _ = run(capsys, "--train-iters", "8", "--exit-interval", "4", "--save", save, "--seed", "3")
    assert sorted(first) == [1, 2, 3, 4] and open(os.path.join(save, LATEST)).read() == "4"
    resumed, out = run(capsys, "--train-iters", "8", "--load", save, "--save", save, "--seed", "3",
                       "--tensorboard-dir", str(tmp_path / "resumed"))
    assert "loaded checkpoint from" in out and sorted(resumed) == [5, 6, 7, 8]
    assert {i: full[i] for i in range(5, 9)} == resumed            # loss and grad norm, to the digit
    assert {i: full[i] for i in range(1, 5)} == first
    for tag in ("lm_loss", "grad-norm"):                           # and the float32 values, bit for bit
        expected = {i: v for i, v in scalars(tmp_path / "full", tag).items() if i > 4}
        assert len(expected) == 4 and scalars(tmp_path / "resumed", tag) == expected, tag
    assert open(os.path.join(save, LATEST)).read() == "8"


def test_layout_metadata_and_pruning(tmp_path, capsys):
    save = tmp_path / "ckpt"
    run(capsys, "--train-iters", "6", "--save", str(save), "--save-interval", "2", "--keep-last-n-checkpoints", "2",
        "--ckpt-format", "safetensors")
    assert {p.name for p in save.iterdir()} == {LATEST, "iter_0000004", "iter_0000006"}
    meta = json.loads((save / "iter_0000006" / "metadata.json").read_text())
    assert meta["iteration"] == 6 and meta["consumed_train_samples"] == 24
    assert meta["model"]["hidden_size"] == 32 and meta["parallel"]["tensor_model_parallel_size"] == 1
    assert meta["versions"]["mindspore"] == "2.10.0"
    assert (save / "iter_0000006" / "mp_rank_00" / "model_optim_rng.safetensors").is_file()


def test_save_retain_interval_keeps_its_multiples_and_the_latest(tmp_path, capsys, monkeypatch):
    """Megatron's --save-retain-interval: each completed save deletes the checkpoint before it
    unless that one's iteration is a multiple of the interval."""
    import rapidgpt.training.checkpointing as checkpointing
    from rapidgpt.arguments import validate_args
    save, after_each_save = tmp_path / "ckpt", []
    prune = checkpointing.prune_checkpoints

    def prune_and_list(*args, **kwargs):
        prune(*args, **kwargs)
        after_each_save.append(sorted(int(p.name[5:]) for p in save.iterdir() if p.name.startswith("iter_")))
    monkeypatch.setattr(checkpointing, "prune_checkpoints", prune_and_list)
    run(capsys, "--train-iters", "7", "--save", str(save), "--save-interval", "1", "--save-retain-interval", "3")
    assert after_each_save == [[1], [2], [3], [3, 4], [3, 5], [3, 6], [3, 6, 7]]
    for flags in (["--save-interval", "2", "--save-retain-interval", "3"], ["--save-retain-interval", "2"]):
        with pytest.raises(ArgumentError) as error:
            validate_args(build_parser().parse_args([*TINY[2:], "--train-iters", "1", "--save", str(tmp_path / "b"),
                                                     *flags]))
        assert any("--save-retain-interval: " in p and "must be a positive multiple of --save-interval" in p
                   for p in error.value.problems), error.value.problems


def test_checkpoint_args_are_used_and_contradictions_refused(trained):
    save = str(trained)
    parser = build_parser()
    argv = ["--load", save, "--hidden-size", "64"]
    args = parser.parse_args(argv)
    with pytest.raises(ArgumentError, match=r"--hidden-size: 64 contradicts the checkpoint under --load .* "
                                             r"which has 32; drop --hidden-size"):
        apply_checkpoint_args(args, given_flags(parser, argv))
    argv = ["--load", save]
    args = parser.parse_args(argv)
    apply_checkpoint_args(args, given_flags(parser, argv))
    assert (args.num_layers, args.hidden_size, args.seq_length) == (2, 32, 16)


def test_partial_latest_falls_back_with_a_warning(trained, tmp_path, capsys):
    save = copy_of(trained, tmp_path)
    weights = save / "iter_0000004" / "mp_rank_00" / "model_optim_rng.ckpt"
    os.chmod(weights, 0o600)
    weights.write_bytes(b"")                                        # a torn write
    assert "model_optim_rng.ckpt|.safetensors missing or empty" in checkpoint_problem(str(save / "iter_0000004"))
    assert find_checkpoint(str(save)) == iteration_dir(str(save), 2)
    _, out = run(capsys, "--train-iters", "4", "--load", str(save))
    assert "WARNING: checkpoint" in out and "falling back to the newest checkpoint that verifies, iteration 2" in out
    assert "loaded checkpoint from" in out and " iteration        3/" in out


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_file_in_latest_falls_back_naming_the_file(trained, tmp_path, capsys, damage):
    """Every file's size and CRC-32 are in metadata.json: a truncated or bit-flipped file is found
    on load, and the newest checkpoint that verifies is used instead (evaluated: the training that
    follows a fallback is test_partial_latest_falls_back_with_a_warning's)."""
    save = copy_of(trained, tmp_path)
    meta = json.loads((save / "iter_0000004" / "metadata.json").read_text())
    assert set(meta["files"]) == {"mp_rank_00/model_optim_rng.ckpt", "mp_rank_00/state.json", "vocab.json",
                                  "merges.txt"}
    weights = save / "iter_0000004" / "mp_rank_00" / "model_optim_rng.ckpt"
    os.chmod(weights, 0o600)
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01                                 # one bit, same size
    weights.write_bytes(bytes(data))
    problem = checkpoint_problem(str(save / "iter_0000004"), verify_contents=True)
    assert "mp_rank_00/model_optim_rng.ckpt" in problem
    assert ("truncated" if damage == "truncate" else "corrupt") in problem
    _, out = run(capsys, "--train-iters", "4", "--load", str(save), "--skip-train")
    assert "mp_rank_00/model_optim_rng.ckpt" in out and "falling back to the newest checkpoint that verifies, " \
                                                         "iteration 2" in out
    assert f"loaded checkpoint from {save} at iteration 2" in out


def test_checkpoint_carries_its_tokenizer_and_works_from_anywhere(tmp_path, capsys, monkeypatch):
    """The tokenizer files are stored inside the checkpoint: generation works from another directory
    after the original files are deleted."""
    from rapidgpt.data.demo_corpus import demo_corpus
    paths = demo_corpus()
    work = tmp_path / "work"
    (work / "tok").mkdir(parents=True)
    for key in ("vocab_file", "merge_file"):
        shutil.copy(paths[key], work / "tok")
    monkeypatch.chdir(work)
    run(capsys, "--train-iters", "2", "--save", "runs/ckpt", "--tokenizer-type", "GPT2BPETokenizer",
        "--vocab-file", "tok/vocab.json", "--merge-file", "tok/merges.txt", "--data-path", paths["data_prefix"])
    meta = json.loads((work / "runs" / "ckpt" / "iter_0000002" / "metadata.json").read_text())
    assert (meta["model"]["vocab_file"], meta["model"]["merge_file"]) == ("vocab.json", "merges.txt")
    shutil.rmtree(work / "tok")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert generation_main(["--load", "../work/runs/ckpt", "--prompt", "The", "--max-new-tokens", "3"]) == 0
    assert "continuation:" in capsys.readouterr().out


def test_unwritable_save_is_refused_at_start_up_as_a_permission_problem(tmp_path, capsys, monkeypatch):
    """Found before training, named as a permission problem. (The suite runs as root, who may write
    anywhere, so the directory's missing write permission is simulated.)"""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    with pytest.raises(SystemExit) as e:
        pretrain_main(TINY + ["--train-iters", "2", "--save", str(locked / "ckpt")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"rapidgpt: error: --save: {locked / 'ckpt'}: no permission to write in its parent {locked} (a " \
           f"permission problem, not disk space)" in err
    assert not (locked / "ckpt").exists()


def test_empty_load_starts_from_scratch_but_skip_train_needs_a_checkpoint(tmp_path, capsys):
    """Megatron's `--save DIR --load DIR` idiom: the first run of a job finds nothing to resume."""
    save = str(tmp_path / "ckpt")
    lines, out = run(capsys, "--train-iters", "2", "--load", save, "--save", save)
    assert f"no checkpoint under --load {save}: starting from scratch" in out and sorted(lines) == [1, 2]
    with pytest.raises(SystemExit):
        pretrain_main(TINY + ["--train-iters", "2", "--load", str(tmp_path / "empty"), "--skip-train"])


def test_changed_schedule_needs_the_override_flag(trained, tmp_path):
    save = str(copy_of(trained, tmp_path))
    out = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + TINY + ["--train-iters", "8", "--lr", "2e-3",
                                                                           "--load", save], capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    error = [line for line in out.stderr.splitlines() if line.startswith("rapidgpt: error:")]
    assert len(error) == 1 and "--load" in error[0]
    assert "--lr: this run 0.002, checkpoint 0.001" in error[0]
    assert "decay length in samples (--lr-decay-iters, default --train-iters, x --global-batch-size; or " \
           "--lr-decay-samples): this run 32, checkpoint 16" in error[0]
    assert "--override-opt_param-scheduler" in error[0] and "--use-checkpoint-opt_param-scheduler" in error[0]
    resumed = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + TINY + [
        "--train-iters", "8", "--lr", "2e-3", "--load", save, "--use-checkpoint-opt_param-scheduler"],
        capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    # the checkpoint's schedule decays over 4 iterations to --min-lr 0: iteration 5 runs at 0, and says so
    assert "the LR schedule has finished decaying at this checkpoint" in resumed.stdout
    assert re.search(r" iteration +5/ +8 \|.*learning rate: 0\.000000E\+00", resumed.stdout)


def test_skip_train_evaluates_the_checkpoint(trained, capsys):
    lines, out = run(capsys, "--train-iters", "4", "--load", str(trained), "--skip-train")
    assert lines == {} and "validation loss at the end of training for val data" in out


def _spawn(argv, env):
    return subprocess.Popen([sys.executable, "-m", "rapidgpt.cli"] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def test_sigterm_saves_at_the_step_boundary_and_sigkill_keeps_the_last_checkpoint(tmp_path):
    save = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = _spawn(TINY + ["--train-iters", "100000", "--save", save, "--save-interval", "1"], env)
    deadline = time.time() + 120
    while read_latest_safe(save) < 3 and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "exiting at iteration" in out and "received SIGTERM" in out
    stopped = int(re.findall(r"exiting at iteration (\d+)", out)[0])
    assert read_latest_safe(save) == stopped and checkpoint_problem(iteration_dir(save, stopped)) is None
    # SIGKILL in the middle of saving, many times: the newest complete checkpoint always loads.
    for _ in range(3):
        proc = _spawn(TINY + ["--train-iters", "100000", "--save", save, "--save-interval", "1", "--load", save], env)
        start = read_latest_safe(save)
        while read_latest_safe(save) < start + 2 and time.time() < deadline + 120:
            time.sleep(0.05)
        proc.kill()
        proc.communicate()
        assert checkpoint_problem(find_checkpoint(save)) is None
    # The next run resumes from it and trains on.
    last = int(Path(find_checkpoint(save)).name[5:])
    out = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + TINY + ["--train-iters", str(last + 1),
                          "--load", save, "--override-opt_param-scheduler"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         timeout=120).stdout
    assert f"loaded checkpoint from {save} at iteration {last}" in out and f" iteration {last + 1:8d}/" in out


def read_latest_safe(save):
    try:
        return int(Path(save, LATEST).read_text())
    except (OSError, ValueError):
        return -1


@pytest.mark.parametrize("failing", ["state.json", "weights"])
def test_full_disk_during_save_keeps_the_previous_checkpoint(trained, tmp_path, monkeypatch, failing):
    """The disk fills while writing state.json (an OSError) or the weights (safetensors' writer
    raises its own error type, not an OSError)."""
    import errno
    from rapidgpt.training import checkpointing
    save = str(copy_of(trained, tmp_path))
    real_write, real_save = checkpointing.write_json, checkpointing.ms.save_checkpoint

    def full_disk(path, payload):
        if "iter_0000006" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, payload)

    def full_disk_weights(params, path, **kwargs):
        if "iter_0000006" in path:
            raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                               'message: "No space left on device" })')
        real_save(params, path, **kwargs)

    if failing == "state.json":
        monkeypatch.setattr(checkpointing, "write_json", full_disk)
    else:
        monkeypatch.setattr(checkpointing.ms, "save_checkpoint", full_disk_weights)
    with pytest.raises(checkpointing.CheckpointError,
                       match=r"could not save checkpoint 6 under --save .*: the disk is full; the last complete "
                             r"checkpoint \(iteration 4\) is intact"):
        pretrain_main(TINY + ["--train-iters", "6", "--load", save, "--save", save, "--override-opt_param-scheduler"])
    assert read_latest_safe(save) == 4 and checkpoint_problem(iteration_dir(save, 4)) is None
    assert sorted(os.listdir(save)) == ["iter_0000002", "iter_0000004", LATEST]     # no partial directory left


def test_text_generation_task_from_a_checkpoint(trained, tmp_path, capsys):
    from rapidgpt.tasks.text_generation import main as generate_main
    save = str(trained)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The assert statement\nClasses\n")
    assert generate_main(["--load", save, "--prompts-file", str(prompts), "--max-new-tokens", "5",
                          "--top-k", "3", "--no-progress-bar"]) == 0
    out = capsys.readouterr().out
    assert "prompt: 'The assert statement'\ncontinuation: '" in out and "prompt: 'Classes'" in out
    result = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--task", "text_generation",
                             "--prompt", "x"], capture_output=True, text=True)
    assert result.returncode == 2 and "rapidgpt: error: --load: text generation needs the checkpoint" in result.stderr
