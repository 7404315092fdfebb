"""Crash soak: kill -9 a training run at random moments, restart it with --load, again and again,
and check that the losses continue exactly as an uninterrupted run's.

    python benchmarks/soak_kill_resume.py [--kills 10] [--iters 40] [--seed 0]

1. reference: `rapidgpt --task pretraining` (tiny GPT, dropout 0.1) for --iters iterations, no
   checkpoints; its loss and grad-norm line of every iteration is kept.
2. soak: the same run with `--save DIR --save-interval 1 --load DIR`, SIGKILLed (the whole process
   group) at a random moment — while starting, compiling, training or writing a checkpoint —
   then restarted; --kills times, then once more to the end.
3. Every iteration line printed by any attempt (iterations re-done after a kill included) must equal
   the reference's to the last digit, every attempt after the first must resume from the newest
   complete checkpoint, and the final run must reach --iters.

Prints one line per attempt and a verdict; exit status 1 if anything differs. Not part of `make
test` (a few minutes); the figures are in the issue notes.
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "pretraining", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
        "--lr-warmup-iters", "2", "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--no-progress-bar",
        "--max-new-tokens", "0", "--seed", "7"]
LINE = re.compile(r" iteration\s+(\d+)/.*?\| lm loss: ([\d.E+-]+) \|.*grad norm: ([\d.]+)")
LOADED = re.compile(r"loaded checkpoint from .* at iteration (\d+)")


def start(argv, log_path):
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "rapidgpt.cli"] + argv, stdout=log, stderr=subprocess.STDOUT,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True), log


def lines(text):
    return [(int(m.group(1)), (m.group(2), m.group(3))) for m in LINE.finditer(text)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--max-delay", type=float, default=12.0,
                        help="longest wait (s) after an attempt starts before killing it")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    work = tempfile.mkdtemp(prefix="rapidgpt-soak-")
    os.environ.setdefault("RAPIDGPT_CACHE_DIR", os.path.join(work, "cache"))
    train = TINY + ["--train-iters", str(opts.iters)]

    proc, log = start(train, os.path.join(work, "reference.log"))
    proc.wait()
    log.close()
    reference = dict(lines(open(log.name).read()))
    if proc.returncode or sorted(reference) != list(range(1, opts.iters + 1)):
        sys.exit(f"reference run failed, see {log.name}")
    print(f"reference: {opts.iters} iterations, lm loss {reference[1][0]} -> {reference[opts.iters][0]}")

    save = os.path.join(work, "ckpt")
    soak = train + ["--save", save, "--save-interval", "1", "--load", save]
    problems, finished, expected_start, kills_in_training = [], False, 0, 0
    for attempt in range(opts.kills + 1):
        proc, log = start(soak, os.path.join(work, f"attempt{attempt}.log"))
        delay = rng.uniform(1.0, opts.max_delay)
        killed = False
        if attempt < opts.kills:
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
        proc.wait()
        log.close()
        text = open(log.name).read()
        seen = lines(text)
        loaded = LOADED.search(text)
        resumed_at = int(loaded.group(1)) if loaded else 0
        wrong = [i for i, values in seen if reference.get(i) != values]
        if wrong:
            problems.append(f"attempt {attempt}: iterations {wrong} differ from the reference")
        if seen and seen[0][0] != resumed_at + 1:
            problems.append(f"attempt {attempt}: resumed at {resumed_at} but printed iteration {seen[0][0]} first")
        if resumed_at < expected_start:
            problems.append(f"attempt {attempt}: resumed at {resumed_at}, an older checkpoint than {expected_start}")
        finished = not killed and proc.returncode == 0 and seen and seen[-1][0] == opts.iters
        print(f"attempt {attempt:2d}: {'killed after %.1f s' % delay if killed else 'ran to the end'}, "
              f"resumed at iteration {resumed_at}, printed {len(seen)} iteration lines "
              f"({seen[0][0] if seen else '-'}..{seen[-1][0] if seen else '-'}), "
              f"{len(seen) - len(wrong)} equal to the reference")
        if seen:
            expected_start = max(expected_start, seen[-1][0] - 1)   # the last line's save may be torn
            kills_in_training += killed
        if finished:
            break
    if not finished:
        problems.append("the final attempt did not reach the last iteration")
    if kills_in_training < opts.kills // 2:
        problems.append(f"only {kills_in_training} kills landed after training had started (start-up is "
                        f"slower than --max-delay on this machine): raise --max-delay")
    print("PASS: every iteration line equals the uninterrupted run's" if not problems else "FAIL:\n  " + "\n  ".join(problems))
    print(f"logs and checkpoints: {work}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
