"""BERT end to end, as a user runs it: a corpus preprocessed with --split-sentences, black-box
`rapidgpt --task pretraining --tokenizer-type BertWordPieceLowerCase ...` with Megatron's BERT log
lines ("lm loss", "sop loss"), the checkpoint loaded by rapidgpt.load_pretrained; and the same run
on TP=2 x PP=2 printing the single-process run's values, and fp16 at TP=2 x DP=2 with ZeRO-3 and
recompute (tensor parallelism without pipeline stages, whose post-LayerNorm layers feed a
tensor-parallel copy's input to the residual too) following the single-process fp16 run: four ranks
each, every parallel dimension in one of them. (ZeRO-2, the GPT's optimizer wrapper, is
model-independent: tests/test_zero.py.)"""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor

import rapidgpt
from rapidgpt.data.demo_corpus import demo_documents
from batched_runs import BatchedRuns, declared_runs, tensorboard_of
from test_parallel import FP16, assert_close_run, assert_layout, assert_same_run, skipped, values

REPO = Path(__file__).resolve().parent.parent
VOCAB = REPO / "tests" / "fixtures" / "hf_bert_tiny" / "vocab.txt"
BERT = ["--task", "pretraining", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(VOCAB),
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3", "--lr-warmup-iters", "2",
        "--train-iters", "8", "--log-interval", "1", "--eval-interval", "4", "--eval-iters", "2",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--seed", "5", "--no-progress-bar",
        "--make-vocab-size-divisible-by", "64"]
LINE = re.compile(r" iteration\s+\d+/\s*\d+ \| consumed samples:\s+\d+ \| .*\| lm loss: [\d.E+-]+ \| "
                  r"sop loss: [\d.E+-]+ \| loss scale: [\d.]+ \| grad norm: [\d.]+ \|")
VALUES = re.compile(r"(lm loss|sop loss|lm loss value|sop loss value|grad norm): ([\d.E+-]+)")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, env):
    """The demo documents preprocessed as a user would: preprocess_data.py --split-sentences."""
    folder = tmp_path_factory.mktemp("bert_corpus")
    with open(folder / "docs.jsonl", "w") as f:
        for text in demo_documents():
            f.write(json.dumps({"text": text}) + "\n")
    subprocess.run([sys.executable, "data_tools/preprocess_data.py", "--input", str(folder / "docs.jsonl"),
                    "--output-prefix", str(folder / "corpus"), "--tokenizer-type", "BertWordPieceLowerCase",
                    "--vocab-file", str(VOCAB), "--split-sentences", "--workers", "2", "--no-progress-bar"],
                   cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return str(folder / "corpus_text_sentence")


TP2_PP2 = ("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2")
FP16_TP2_ZERO3_RECOMPUTE = (*FP16, "--tensor-model-parallel-size", "2", "--zero-3-memory-optimization",
                            "--recompute-activations")
NO_BINARY_HEAD = ("--bert-no-binary-head", "--train-iters", "4", "--eval-interval", "4")
BERT_RUNS = [(1,), (4, *TP2_PP2), (1, *FP16), (4, *FP16_TP2_ZERO3_RECOMPUTE), (1, *NO_BINARY_HEAD)]


@pytest.fixture(scope="module")
def bert_runs(corpus, env, tmp_path_factory, request):
    """`bert_runs(nproc, *flags)`: the BERT run with `flags`, once per module, the BERT_RUNS of one
    size in one job (tests/batched_runs.py) -> (its printed values with TensorBoard's grad norms,
    its --save folder, its log)."""
    def argv(nproc, *flags):
        return nproc, BERT + ["--data-path", corpus, *flags]
    batched = BatchedRuns(env, tmp_path_factory.mktemp("bert_runs"),
                          [argv(*key) for key in declared_runs(request, "BERT_RUNS")], seconds_per_run=400)

    def run(nproc, *flags):
        status, log, save = batched(*argv(nproc, *flags))
        assert status == 0, log[-3000:]
        return values(log, tensorboard_of(save), VALUES), save, log
    return run


def test_black_box_pretraining_logs_megatrons_bert_lines_and_loads(bert_runs):
    found, ckpt, log = bert_runs(1)
    lines = [line for line in log.splitlines() if line.startswith(" iteration")]
    assert len(lines) == 8 and all(LINE.match(line) for line in lines), lines[:2]
    assert log.count(" validation loss at ") == 3 and "sop loss value:" in log
    lm = [v for name, v in found if name == "lm loss"]
    assert lm[-1] < lm[0]
    model = rapidgpt.load_pretrained(str(ckpt))
    ids = np.array([[2, 20, 21, 3, 30, 31, 3, 0]], np.int32)
    mask = (ids > 0).astype(np.int32)
    types = np.array([[0, 0, 0, 0, 1, 1, 1, 0]], np.int32)
    lm_logits, binary_logits = model(Tensor(ids), Tensor(mask), Tensor(types))
    assert lm_logits.shape == (1, 8, 200) and binary_logits.shape == (1, 2)


def test_tp2_pp2_prints_the_single_process_run(bert_runs):
    reference, _, _ = bert_runs(1)
    found, save, log = bert_runs(4, *TP2_PP2)
    assert_layout(save, tp=2, world_size=4, pp=2)
    assert len(reference) == 3 * 8 + 2 * 3         # (lm, sop loss, norm) per iteration, (lm, sop) per validation
    assert_same_run(found, reference)


def test_fp16_at_tp2_dp2_with_zero3_and_recompute_follows_the_single_process_fp16_run(bert_runs):
    """ZeRO-3 over the data-parallel ranks: the backward gathers the weights of the masked-LM and the
    sentence-order heads again, on two independent branches, so each rank's collectives run in the
    order its own compiled graph sorts them in: with pieces of different numbers and lengths per
    rank (Megatron's flat layout) the ranks' orders differed and a BERT run with ZeRO-3 at DP=4
    stopped at its first step ("Memcpy error" in the ring all-reduce); with even pieces
    (EvenShardPlan) every rank compiles the same graph."""
    reference, _, single_log = bert_runs(1, *FP16)
    found, save, log = bert_runs(4, *FP16_TP2_ZERO3_RECOMPUTE)
    assert_layout(save, tp=2, world_size=4)
    assert "ZeRO stage 3" in log and "activation recompute: selective (core attention) (2 cells marked)" in log
    assert skipped(log) == skipped(single_log)
    assert_close_run(found, reference, 5e-3)


def test_without_the_binary_head_only_the_masked_lm_loss_is_trained_and_logged(bert_runs):
    found, ckpt, log = bert_runs(1, *NO_BINARY_HEAD)
    lines = [line for line in log.splitlines() if line.startswith(" iteration")]
    assert len(lines) == 4 and all("| lm loss: " in line and "sop loss" not in line for line in lines), lines[:1]
    model = rapidgpt.load_pretrained(str(ckpt))
    assert not model.add_binary_head
