"""The single-process engine: flags, templates, GPT vs numpy, compiled step semantics, log lines."""
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor

from rapidgpt.arguments import ArgumentError, build_parser, parse_args, validate_args
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.models.gpt import build_gpt_model, lm_loss_func
from rapidgpt.optim import OptimizerWrapper
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.parallel.state import ParallelState
from rapidgpt.tokenizer import padded_vocab_size
from rapidgpt.training.finetuner import Finetuner
from rapidgpt.training.pretrainer import Pretrainer, next_batch
from rapidgpt.training.reporting import training_log_line, validation_lines
from rapidgpt.training.step import TrainStep

from numpy_gpt import numpy_gpt_logits

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--vocab-size", "50", "--micro-batch-size", "4", "--no-progress-bar", "--seed", "7"]


def make_engine(*extra):
    return RapidGPTEngine(argv=TINY + list(extra))


def validate(*argv):
    return validate_args(build_parser().parse_args(list(argv)))


# ---- flags ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["--hidden-size", "30", "--num-attention-heads", "4"],
     "--hidden-size: 30 is not divisible by --num-attention-heads 4"),
    (["--micro-batch-size", "3", "--global-batch-size", "8"],
     "--global-batch-size: 8 must be a positive multiple of --micro-batch-size 3"),
    (["--train-iters", "5", "--train-samples", "40"], "--train-samples: give either --train-iters or --train-samples"),
    (["--seq-length", "64", "--max-position-embeddings", "32"],
     "--max-position-embeddings: 32 is smaller than --seq-length 64"),
    (["--lr", "1e-3", "--min-lr", "1e-2"], "--min-lr: 0.01 must be in [0, --lr 0.001]"),
    (["--split", "a,b"], "--split: --split 'a,b': expected up to three non-negative weights"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json"], "--merge-file: required for --tokenizer-type GPT2BPETokenizer"),
    (["--hidden-dropout", "1.0"], "--hidden-dropout: must be in [0, 1)"),
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size: 1 process cannot be split into groups of 2 (TP)"),
    (["--fp16", "--bf16"], "--bf16: give either --fp16 (or --mixed-precision) or --bf16, not both"),
    (["--loss-scale", "128"], "--loss-scale: loss scaling is for 16-bit training; add --fp16 or --bf16"),
    (["--fp16", "--hysteresis", "0"], "--hysteresis: must be positive, got 0"),
    (["--bf16", "--initial-loss-scale", "1024"], "--initial-loss-scale: dynamic loss scaling is fp16's"),
    (["--fp16", "--min-loss-scale", "8", "--initial-loss-scale", "4"],
     "--min-loss-scale: 8.0 is above --initial-loss-scale 4.0"),
    (["--mock-data", "--data-path", "x"], "--mock-data: give one data source, not --mock-data and --data-path"),
    (["--mock-data"], "--mock-data: the mock documents end with the tokenizer's end-of-document id; give "
                      "--tokenizer-type (e.g. NullTokenizer --vocab-size N)"),
    (["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "9", "--task", "sequence_classification"],
     "--mock-data: Megatron's mock documents are GPT pretraining data, not --task sequence_classification's"),
    (["--save-interval", "5"], "--save-interval: needs --save DIR"),
    (["--skip-train"], "--skip-train: evaluates a checkpoint; give --load"),
    (["--exit-interval", "0"], "--exit-interval: must be positive"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "1"],
     "--recompute-method: full recompute needs --recompute-method uniform or block"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "9"],
     "--recompute-num-layers: must be in [1, --num-layers 4], got 9"),
    (["--recompute-activations", "--recompute-num-layers", "2"],
     "--recompute-num-layers: only for --recompute-granularity full (selective recompute given)"),
    (["--checkpoint-activations", "--recompute-method", "block"], "--checkpoint-activations: it means "
     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"),
    (["--user-script", "nope.py"], "--user-script: nope.py: no such file"),
])
def test_flag_errors_name_the_flag(argv, message):
    with pytest.raises(ArgumentError) as e:
        validate(*argv)
    assert message in str(e.value)


def test_parse_args_exits_2_with_one_message(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv=["--num-layers", "0"])
    assert e.value.code == 2
    assert "error: --num-layers: must be positive, got 0" in capsys.readouterr().err


def test_every_problem_is_reported_at_once_in_one_line_each(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv=["--num-layer", "3", "--lr", "abc", "--optimizer", "adamw", "--hidden-size", "30",
                         "--loss-scale", "8", "--vocab-file", "/no/such/vocab.json", "--tokenizer-type", "GPT2BPETokenizer",
                         "--merge-file", "/no/such/merges.txt", "stray"])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().split("\n")
    assert lines[-1] == "rapidgpt: see 'rapidgpt --help' for every flag"
    assert sorted(lines[:-1]) == sorted([
        "rapidgpt: error: --num-layer: unknown flag; did you mean --num-layers?",
        "rapidgpt: error: --lr: 'abc' is not a number; give e.g. --lr 0.1",
        "rapidgpt: error: --optimizer: 'adamw' is not one of the choices; did you mean adam? choose one of adam, sgd",
        "rapidgpt: error: --hidden-size: 30 is not divisible by --num-attention-heads 4; choose sizes whose "
        "heads are equal, or give --kv-channels",
        "rapidgpt: error: --loss-scale: loss scaling is for 16-bit training; add --fp16 or --bf16, or remove it",
        "rapidgpt: error: --vocab-file: /no/such/vocab.json: no such file; check the path",
        "rapidgpt: error: --merge-file: /no/such/merges.txt: no such file; check the path",
        "rapidgpt: error: stray: unexpected value (no flag takes it); remove it or put its flag before it"])


@pytest.mark.parametrize("argv,messages", [
    (["--task", "pretraining", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v.json", "--merge-file",
      "m.txt"], ["--tokenizer-type: without --data-path, --task pretraining trains on the embedded demo corpus"]),
    (["--task", "pretraining", "--model-type", "bert", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
      "v.json", "--merge-file", "m.txt", "--data-path", "corpus_text_sentence", "--mask-prob", "1.5"],
     ["--tokenizer-type: BERT needs [CLS]/[SEP]/[MASK]/[PAD] from a WordPiece vocabulary",
      "--mask-prob: must be in (0, 1)"]),
    (["--task", "sequence_classification", "--data-path", "missing.jsonl", "--epochs", "1"],
     ["--data-path: 'missing.jsonl': no such file (nor missing.jsonl.bin/.idx); check the path",
      "--tokenizer-type: sequence classification reads text; give --pretrained-checkpoint"]),
    (["--data-path", "0.5", "corpus_text_document", "0.5", "other_text_document"],
     ["--data-path: 'other_text_document': no such file"]),
    (["--nnodes", "abc", "--node-rank", "x"], ["--nnodes: 'abc' is not an integer", "--node-rank: 'x' is not an integer"]),
    (["--data-path", "corpus"], ["--data-path: 'corpus': no such file (nor corpus.bin/.idx)"]),
    (["--task", "text_generation", "--lr-decay-iters", "0"],
     ["--load: text generation needs the checkpoint", "--prompt: text generation needs --prompt TEXT",
      "--lr-decay-iters: must be positive, got 0"]),
    (["--task", "sequence_classification", "--skip-train", "--load", "ckpt", "--predictions-file", "no/dir/p.jsonl"],
     ["--valid-data-path: --skip-train evaluates on the validation data", "--predictions-file: no such directory"]),
])
def test_task_and_data_flags_are_checked_up_front(argv, messages, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("v.json", "m.txt", "corpus_text_document.bin", "corpus_text_document.idx"):
        (tmp_path / name).write_text("")
    with pytest.raises(SystemExit):
        parse_args(argv=argv)
    err = capsys.readouterr().err
    assert all(f"rapidgpt: error: {m}" in err for m in messages), err


def test_help_of_a_user_script_lists_its_own_flags():
    script = Path(__file__).parent / "distributed" / "mlp_finetuner.py"
    result = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--user-script", str(script), "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--no-gather-metrics" in result.stdout and "--num-layers" in result.stdout


def test_flags_are_checked_without_importing_mindspore():
    code = ("import sys\nfrom rapidgpt.cli import main\ntry:\n    main(['--task', 'pretraining', '--num-layer', '2'])\n"
            "except SystemExit as e:\n    assert e.code == 2\nassert 'mindspore' not in sys.modules, 'imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "did you mean --num-layers?" in result.stderr


def test_derived_values_and_extra_args():
    def extra(parser):
        parser.add_argument("--my-flag", type=int, default=3)
    args = parse_args(extra, ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-samples", "20",
                              "--hidden-size", "64", "--my-flag", "5"])
    assert args.num_micro_batches == 4 and args.train_iters == 3 and args.data_parallel_size == 1
    assert args.ffn_hidden_size == 256 and args.max_position_embeddings == args.seq_length
    assert args.my_flag == 5
    assert padded_vocab_size(50257, 128) == 50304 and padded_vocab_size(8000, 64) == 8000
    assert padded_vocab_size(50257, 128, 2) == 50432


def test_megatron_command_line_parses(tmp_path, monkeypatch):
    """A Megatron GPT pretraining command line, program name changed, parses unchanged."""
    monkeypatch.chdir(tmp_path)
    for name in ("v.json", "m.txt", "my_text_document.bin", "my_text_document.idx"):
        (tmp_path / name).write_text("")
    args = parse_args(argv=(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
        "--max-position-embeddings 64 --micro-batch-size 4 --global-batch-size 8 --train-iters 100 "
        "--lr 0.00015 --min-lr 1.0e-5 --lr-decay-style cosine --lr-decay-iters 80 --lr-warmup-fraction .01 "
        "--weight-decay 1e-2 --clip-grad 1.0 --data-path my_text_document --vocab-file v.json "
        "--merge-file m.txt --tokenizer-type GPT2BPETokenizer --split 949,50,1 --data-impl mmap "
        "--log-interval 10 --eval-interval 50 --eval-iters 5 --tensorboard-dir tb --seed 42").split())
    assert args.num_micro_batches == 2 and args.lr_decay_style == "cosine" and args.data_path == ["my_text_document"]


def test_parallel_state_rank_order_is_megatrons():
    state = ParallelState(world_size=8, rank=5, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert state.data_parallel_size == 2
    assert state.coordinates() == (1, 0, 1)                    # rank = tp + 2*(dp + 2*pp)
    assert state.tensor_parallel_ranks() == [4, 5]
    assert state.data_parallel_ranks() == [5, 7]
    assert state.pipeline_parallel_ranks() == [1, 5]
    assert state.pipeline_wrap_pair() == [1, 5]            # the interleaved schedule's ring: last -> first
    assert ParallelState(world_size=4, rank=1, pipeline_model_parallel_size=4).pipeline_wrap_pair() is None
    assert ParallelState(world_size=4, rank=3, pipeline_model_parallel_size=4).pipeline_wrap_pair() == [0, 3]
    with pytest.raises(ValueError, match="world size 6 is not divisible by --tensor-model-parallel-size 4"):
        ParallelState(world_size=6, tensor_model_parallel_size=4)


@pytest.mark.parametrize("world,argv,message", [
    (4, ["--tensor-model-parallel-size", "4", "--num-attention-heads", "6", "--hidden-size", "96"],
     "--num-attention-heads: 6 is not divisible by --tensor-model-parallel-size 4"),
    (4, ["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33"],
     "--ffn-hidden-size: 33 is not divisible by --tensor-model-parallel-size 2"),
    (6, ["--tensor-model-parallel-size", "4"], "--tensor-model-parallel-size: 6 processes cannot be split into groups of 4 (TP)"),
    (4, ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "6"],
     "--global-batch-size: 6 must be a positive multiple of --micro-batch-size 2 x data-parallel size 2"),
    (4, ["--pipeline-model-parallel-size", "4", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "3"],
     "--num-layers-per-virtual-pipeline-stage: 3 does not divide the 2 layers of each of the 4 stages"),
    (4, ["--pipeline-model-parallel-size", "4", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "1",
         "--global-batch-size", "4", "--micro-batch-size", "2"],
     "--microbatch-group-size-per-virtual-pipeline-stage 4: the interleaved schedule runs groups of 4 micro-batches "
     "but a step has 2"),
    (4, ["--pipeline-model-parallel-size", "4", "--num-layers", "8", "--num-virtual-stages-per-pipeline-rank", "2",
         "--decoder-first-pipeline-num-layers", "3"],
     "--decoder-first-pipeline-num-layers: 3 layers cannot be cut into the 2 model chunks"),
    (4, ["--pipeline-model-parallel-size", "4", "--num-layers", "8", "--num-layers-per-virtual-pipeline-stage", "1",
         "--decoder-last-pipeline-num-layers", "2"],
     "--num-layers-per-virtual-pipeline-stage: with --decoder-first/last-pipeline-num-layers give the chunk count"),
    (1, ["--num-virtual-stages-per-pipeline-rank", "2"],
     "--pipeline-model-parallel-size 1: the pipeline split flags"),
])
def test_layout_errors_name_the_flags(world, argv, message):
    with pytest.raises(ArgumentError, match=re.escape(message)):
        validate_args(build_parser().parse_args(argv), world_size=world)


@pytest.mark.parametrize("world,argv,problems", [
    (2, ["--pipeline-model-parallel-size", "3"],          # also not a divisor of --num-layers 4: one cause
     ["--pipeline-model-parallel-size: 2 processes cannot be split into groups of 1 (TP) x 3 (PP), nor "
      "--num-layers 4 into 3 equal stages; choose a stage count that divides the layers and, times TP 1, "
      "the number of processes (--nproc-per-node x --nnodes)"]),
    (2, ["--pipeline-model-parallel-size", "4"],
     ["--pipeline-model-parallel-size: 2 processes cannot be split into groups of 1 (TP) x 4 (PP); make the "
      "number of processes (--nproc-per-node x --nnodes) a multiple of 4"]),
    (4, ["--pipeline-model-parallel-size", "3", "--tensor-model-parallel-size", "3", "--num-attention-heads", "6",
         "--hidden-size", "96"],
     ["--pipeline-model-parallel-size: --num-layers 4 cannot be split into 3 equal stages; choose a stage count "
      "that divides the layers, or set --decoder-first/last-pipeline-num-layers",
      "--tensor-model-parallel-size: 4 processes cannot be split into groups of 3 (TP) x 3 (PP); make the "
      "number of processes (--nproc-per-node x --nnodes) a multiple of 9"]),
], ids=["pp-processes-and-layers", "pp-processes", "tp-processes-pp-layers"])
def test_a_layout_error_is_reported_once_on_the_flag_that_is_wrong(world, argv, problems):
    """--pipeline-model-parallel-size 3 on 2 processes: one message on the pipeline flag (not a second
    one blamed on --tensor-model-parallel-size); "1 process", singular, above."""
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(argv), world_size=world)
    assert error.value.problems == problems


def test_layout_derives_data_parallel_size_and_micro_batches():
    args = validate_args(build_parser().parse_args(["--tensor-model-parallel-size", "2", "--micro-batch-size", "2",
                                                    "--global-batch-size", "16"]), world_size=8)
    assert (args.data_parallel_size, args.num_micro_batches) == (4, 2)


# ---- template contract ----------------------------------------------------------------------------

def test_missing_hooks_are_named_with_signatures():
    make_engine("--train-iters", "1")

    class Half(Pretrainer):
        def run_forward_step(self, data_iterator, model):
            return None

    with pytest.raises(NotImplementedError) as e:
        Half().train()
    text = str(e.value)
    assert "Half must implement these hooks of Pretrainer" in text
    assert "def train_valid_test_datasets_provider(self, train_val_test_num_samples)" in text
    assert "def model_optimizer_lr_scheduler_provider(self, pre_process=True" in text
    assert "run_forward_step" not in text and "run_compute_metrics" not in text   # given / has default

    class Empty(Finetuner):
        pass

    with pytest.raises(NotImplementedError) as e:
        Empty().train()
    assert all(h in str(e.value) for h in ("train_valid_test_datasets_provider(self)",
                                           "run_forward_step(self, batch, model)",
                                           "run_compute_metrics(self, model, eval_dataloader)"))


def test_next_batch_outside_and_inside_the_compiled_step():
    assert next_batch(iter([{"a": 1}])) == {"a": 1}
    batch = {"tokens": 1}
    assert next_batch(batch) is batch


# ---- the GPT against numpy ------------------------------------------------------------------------

def _randomize_norms(model, seed=0):
    """LayerNorm starts at ones/zeros; give it random values so the reference checks its use."""
    rng = np.random.default_rng(seed)
    for name, param in model.parameters_and_names():
        if "layernorm" in name or name.endswith("bias"):
            param.set_data(Tensor(rng.normal(1.0 if name.endswith("gamma") else 0.0, 0.1,
                                             param.shape).astype(np.float32)))


def test_gpt_forward_matches_numpy():
    args = make_engine("--hidden-dropout", "0", "--attention-dropout", "0").args
    model = build_gpt_model(args, 50)
    initialize_parameters(model, args.seed)
    _randomize_norms(model)
    model.set_train(False)
    tokens = np.random.default_rng(1).integers(0, 50, (2, 16)).astype(np.int32)
    positions = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    logits = model(Tensor(tokens), Tensor(positions)).asnumpy()
    params = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    reference = numpy_gpt_logits(params, tokens, heads=4)[..., :50]
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    losses = model(Tensor(tokens), Tensor(positions), None, Tensor(tokens)).asnumpy()
    log_probs = reference - np.log(np.exp(reference).sum(-1, keepdims=True))
    np.testing.assert_allclose(losses, -np.take_along_axis(log_probs, tokens[..., None], -1)[..., 0],
                               rtol=1e-4, atol=1e-4)


def test_vocab_padding_does_not_change_the_model():
    """Real rows are drawn identically whatever the padding; padded rows never reach the output."""
    outputs = []
    for divisible_by in ("1", "64"):
        args = make_engine("--make-vocab-size-divisible-by", divisible_by, "--hidden-dropout", "0",
                           "--attention-dropout", "0").args
        model = build_gpt_model(args, 50)
        initialize_parameters(model, args.seed)
        model.set_train(False)
        tokens = Tensor(np.arange(32, dtype=np.int32).reshape(2, 16) % 50)
        positions = Tensor(np.tile(np.arange(16, dtype=np.int32), (2, 1)))
        emb = model.word_embeddings.weight.asnumpy()
        outputs.append((model.padded_vocab_size, emb, model(tokens, positions).asnumpy(),
                        model(tokens, positions, None, tokens).asnumpy()))
    (pad_a, emb_a, logits_a, loss_a), (pad_b, emb_b, logits_b, loss_b) = outputs
    assert (pad_a, pad_b) == (50, 64) and logits_b.shape[-1] == 50
    np.testing.assert_array_equal(emb_a, emb_b[:50])
    assert not emb_b[50:].any()
    np.testing.assert_allclose(logits_a, logits_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5, atol=1e-6)


def test_initialization_is_seeded_by_name():
    args = make_engine().args
    a, b = build_gpt_model(args, 50), build_gpt_model(args, 50)
    initialize_parameters(a, 7)
    initialize_parameters(b, 7)
    for (name, pa), (_, pb) in zip(a.parameters_and_names(), b.parameters_and_names()):
        np.testing.assert_array_equal(pa.asnumpy(), pb.asnumpy(), err_msg=name)
    q0 = a.layers[0].self_attention.query_key_value.weight.asnumpy()
    q1 = a.layers[1].self_attention.query_key_value.weight.asnumpy()
    assert not np.allclose(q0, q1)                                   # each name its own stream
    assert abs(q0.std() - 0.02) < 0.003
    dense_std = a.layers[0].self_attention.dense.weight.asnumpy().std()
    assert abs(dense_std - 0.02 / math.sqrt(4)) < 0.002             # scaled init, 2 layers


# ---- the compiled step ----------------------------------------------------------------------------

def _model_and_batch(args, batch_size, seed=3):
    model = build_gpt_model(args, 50)
    initialize_parameters(model, args.seed)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50, (batch_size, 17)).astype(np.int32)
    batch = {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
             "loss_mask": np.ones((batch_size, 16), np.float32),
             "position_ids": np.tile(np.arange(16, dtype=np.int32), (batch_size, 1))}
    return model, batch


def _forward(model, per_token=False):
    def forward(batch):
        output = model(batch["tokens"], batch["position_ids"], None, batch["labels"])
        return output, lambda out: lm_loss_func(batch["loss_mask"], out, per_token)
    return forward


def test_grad_accumulation_equals_one_large_batch():
    from rapidgpt.optim import SGD
    args = make_engine("--hidden-dropout", "0", "--attention-dropout", "0").args
    results = []
    for n in (1, 2):
        model, batch = _model_and_batch(args, 4)
        model.set_train(True)
        optimizer = SGD(model.trainable_params(), 0.5, momentum=0.0)
        step = TrainStep(_forward(model), OptimizerWrapper.around(optimizer), n)
        stacked = {k: Tensor(v.reshape((n, 4 // n) + v.shape[1:])) for k, v in batch.items()}
        result = step(stacked, 0.5, 1)
        loss, norm, finite = result.loss, result.grad_norm, result.updated
        results.append((loss, norm, {p.name: p.asnumpy().copy() for p in model.trainable_params()}))
    (loss1, norm1, params1), (loss2, norm2, params2) = results
    assert finite and loss1 == pytest.approx(loss2, rel=1e-6) and norm1 == pytest.approx(norm2, rel=1e-5)
    for name in params1:
        np.testing.assert_allclose(params1[name], params2[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_eager_and_compiled_steps_agree():
    args = make_engine("--hidden-dropout", "0.1", "--attention-dropout", "0.1").args    # same masks
    losses = []
    for jit in (True, False):
        model, batch = _model_and_batch(args, 4)
        from rapidgpt.optim import build_optimizer
        optimizer = build_optimizer(args, model.trainable_params())
        step = TrainStep(_forward(model), OptimizerWrapper.around(optimizer, 1.0), 1, jit=jit)
        stacked = {k: Tensor(v[None]) for k, v in batch.items()}
        losses.append([step(stacked, 1e-3, i)[0] for i in range(1, 4)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    assert losses[0][2] < losses[0][0]


def test_loss_falls_on_a_tiny_overfit_run():
    args = make_engine("--lr", "3e-3", "--hidden-dropout", "0", "--attention-dropout", "0").args
    model, batch = _model_and_batch(args, 4)
    from rapidgpt.optim import build_optimizer
    step = TrainStep(_forward(model), OptimizerWrapper.around(build_optimizer(args, model.trainable_params()), 1.0), 1)
    stacked = {k: Tensor(v[None]) for k, v in batch.items()}
    losses = [step(stacked, 3e-3, i)[0] for i in range(1, 41)]
    assert losses[0] > math.log(50) - 0.5 and losses[-1] < 0.5 * losses[0]


# ---- log lines ------------------------------------------------------------------------------------

# What Megatron log parsers match (e.g. the regexes of Megatron's own CI and common plot scripts).
MEGATRON_ITERATION = re.compile(
    r"iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) \| elapsed time per iteration \(ms\):"
    r" ([\d.]+) \| learning rate: ([\d.E+-]+) \| global batch size:\s+(\d+) \| lm loss: ([\d.E+-]+) \|"
    r" loss scale: ([\d.]+) \| grad norm: ([\d.]+) \| number of skipped iterations:\s+(\d+) \|"
    r" number of nan iterations:\s+(\d+) \|")
MEGATRON_VALIDATION = re.compile(r"validation loss at (.*?) \| lm loss value: ([\d.E+-]+) \| "
                                 r"lm loss PPL: ([\d.E+-]+) \|")


def test_log_lines_follow_megatron_format():
    line = training_log_line(10, 100, 80, 512.34, 1e-3, 8, {"lm loss": 6.123456}, 1.0, 1.2345, 0, 0, 2000.0)
    assert line == (" iteration       10/     100 | consumed samples:           80 | elapsed time per "
                    "iteration (ms): 512.3 | learning rate: 1.000000E-03 | global batch size:     8 | "
                    "lm loss: 6.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped "
                    "iterations:   0 | number of nan iterations:   0 | tokens per second: 2000.0 |")
    fields = MEGATRON_ITERATION.search(line).groups()
    assert fields[0] == "10" and float(fields[6]) == pytest.approx(6.123456)
    rule, text, rule2 = validation_lines("iteration 100", {"lm loss": 2.0})
    assert rule == rule2 == "-" * (len(text) + 1)
    assert MEGATRON_VALIDATION.search(text).groups() == ("iteration 100", "2.000000E+00", f"{math.exp(2):.6E}")


def test_progress_bar_shows_no_loss_for_a_skipped_iteration(monkeypatch):
    """As Megatron's log line leaves a skipped iteration's loss (fp16 overflow: no update) out of its
    average, the tqdm bar shows no loss for it, but that it was skipped."""
    from types import SimpleNamespace
    from rapidgpt.training import reporting
    from rapidgpt.training.step import StepResult
    lines = []
    monkeypatch.setattr(reporting, "get_logger", lambda: SimpleNamespace(info=lines.append))
    monkeypatch.setattr(reporting, "get_timers", lambda: None)
    monkeypatch.setattr(reporting, "get_scalar_writer", lambda: None)
    monkeypatch.setattr(reporting, "is_console_rank", lambda: True)
    args = SimpleNamespace(no_progress_bar=False, log_interval=2, tensorboard_log_interval=1, global_batch_size=8,
                           timing_log_level=0, log_timers_to_tensorboard=False, log_memory_to_tensorboard=False)
    reporter = reporting.Reporter(args, train_iters=4)
    reporter.iteration(1, 8, {"lm loss": 6.5}, (1e-3,), StepResult(6.5, 1.0, True, 1024.0), 0.1, 100)
    assert reporter.bar.postfix == "lm loss=6.500"
    reporter.iteration(2, 16, {"lm loss": 7.25}, (1e-3,), StepResult(7.25, float("inf"), False, 512.0), 0.1, 100)
    assert "7.25" not in reporter.bar.postfix and "skipped" in reporter.bar.postfix
    assert "lm loss: 6.500000E+00 |" in lines[-1] and "number of skipped iterations:   1 |" in lines[-1]
    reporter.iteration(3, 24, {"lm loss": 6.25}, (1e-3,), StepResult(6.25, 1.0, True, 512.0), 0.1, 100)
    assert reporter.bar.postfix == "lm loss=6.250"
    reporter.close()


def test_timers_and_memory_go_to_tensorboard_as_megatron_writes_them(monkeypatch):
    """--log-timers-to-tensorboard: at each --log-interval, `<timer>-time` (the slowest rank's seconds
    per iteration, before the timing block resets them) and, from the second interval on (the first
    holds the compile), `iteration-time`. --log-memory-to-tensorboard: on the CPU, the process's
    resident bytes now and at most, every --tensorboard-log-interval."""
    from types import SimpleNamespace
    from rapidgpt.global_vars import Timers
    from rapidgpt.training import reporting
    from rapidgpt.training.step import StepResult
    scalars, lines, timers = [], [], Timers(log_level=1)
    monkeypatch.setattr(reporting, "get_logger", lambda: SimpleNamespace(info=lines.append))
    monkeypatch.setattr(reporting, "get_timers", lambda: timers)
    monkeypatch.setattr(reporting, "get_scalar_writer",
                        lambda: SimpleNamespace(add_scalar=lambda *scalar: scalars.append(scalar), close=lambda: None))
    monkeypatch.setattr(reporting, "is_console_rank", lambda: True)
    args = SimpleNamespace(no_progress_bar=True, log_interval=2, tensorboard_log_interval=4, global_batch_size=8,
                           timing_log_level=1, log_timers_to_tensorboard=True, log_memory_to_tensorboard=True)
    reporter = reporting.Reporter(args, train_iters=4)
    step = timers("forward-backward-optimizer", log_level=1)
    for iteration, seconds in ((1, 3.0), (2, 0.5), (3, 0.5), (4, 0.25)):
        step.elapsed_ += seconds
        reporter.iteration(iteration, 8 * iteration, {"lm loss": 6.5}, (1e-3,), StepResult(6.5, 1.0, True, 1.0),
                           seconds, 100)
    reporter.close()
    assert [scalar for scalar in scalars if scalar[0].endswith("-time")] == [
        ("forward-backward-optimizer-time", 1.75, 2), ("iteration-time", 0.375, 4),
        ("forward-backward-optimizer-time", 0.375, 4)]
    memory = {name: value for name, value, iteration in scalars if name.startswith("mem-")}
    assert sorted(memory) == ["mem-max-rss-bytes", "mem-rss-bytes"]           # at iteration 4 only
    assert 0 < memory["mem-rss-bytes"] <= memory["mem-max-rss-bytes"]
    assert "forward-backward-optimizer .....................: (1750.00, 1750.00)" in "\n".join(lines)


class CharTokenizer:
    """ids 1..49 from characters; an eod the model never emits, so runs go to their limit."""
    eod = -1

    def tokenize(self, text):
        return [ord(c) % 49 + 1 for c in text]

    def detokenize(self, ids):
        return "".join(chr(96 + i % 26) for i in ids)


def test_generation_with_kv_cache_equals_full_recompute():
    from rapidgpt.models.generation import generate
    args = make_engine("--max-position-embeddings", "24").args
    model = build_gpt_model(args, 50)
    initialize_parameters(model, args.seed)
    _randomize_norms(model)
    model.set_train(True)
    for kwargs in (dict(), dict(top_k=5, temperature=0.7, seed=3), dict(top_p=0.9, seed=4)):
        cached = generate(model, CharTokenizer(), "abcdef", 30, use_cache=True, **kwargs)
        full = generate(model, CharTokenizer(), "abcdef", 30, use_cache=False, **kwargs)
        assert cached == full and len(cached) == 24 - 6       # stops at max positions
    assert generate(model, CharTokenizer(), "abc", 8, top_k=1) == generate(model, CharTokenizer(), "abc", 8)
    assert model.training                                      # generate() restores the mode
    # Same logits step by step, not only the same argmax.
    model.set_train(False)
    tokens = np.array([[3, 7, 9, 11, 2]], np.int32)
    full = model(Tensor(tokens), Tensor(np.arange(5, dtype=np.int32)[None])).asnumpy()
    first, past = model.decode(Tensor(tokens[:, :3]), Tensor(np.arange(3, dtype=np.int32)[None]))
    rest, _ = model.decode(Tensor(tokens[:, 3:]), Tensor(np.array([[3, 4]], np.int32)), past)
    np.testing.assert_allclose(np.concatenate([first.asnumpy(), rest.asnumpy()], 1), full, rtol=1e-5, atol=1e-5)


def test_choose_token_top_p_keeps_the_nucleus():
    from rapidgpt.models.generation import choose_token
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    picks = {choose_token(logits, rng, top_p=0.75) for _ in range(200)}
    assert picks == {0, 1}                                      # 0.5 + 0.3 reaches 0.75
    assert choose_token(logits, rng) == 0                        # greedy


def test_schedule_units_do_not_mix():
    with pytest.raises(ArgumentError, match="with --train-samples give the schedule in samples"):
        validate("--train-samples", "100", "--lr-warmup-iters", "5")
    with pytest.raises(ArgumentError, match="--lr-decay-samples/--lr-warmup-samples go with --train-samples"):
        validate("--train-iters", "10", "--lr-decay-samples", "50")


def test_warmup_longer_than_decay_is_a_flag_error():
    with pytest.raises(ArgumentError, match="--lr-warmup-iters: 10 is longer than the decay"):
        validate("--train-iters", "4", "--lr-warmup-iters", "10")


def test_non_finite_step_is_skipped_and_weights_untouched():
    from rapidgpt.optim import build_optimizer
    args = make_engine("--hidden-dropout", "0", "--attention-dropout", "0").args
    model, batch = _model_and_batch(args, 4)
    batch["loss_mask"][0, 0] = np.nan                     # bad data: the loss and grads become NaN
    step = TrainStep(_forward(model), OptimizerWrapper.around(build_optimizer(args, model.trainable_params()), 1.0), 1)
    before = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    loss, norm, finite = step({k: Tensor(v[None]) for k, v in batch.items()}, 1e-3, 1)[:3]
    assert not finite and math.isnan(loss) and math.isnan(norm)
    for p in model.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)


def _squared_forward(net, per_token):
    """The forward hook: per-token losses (x w)^2 and the loss mask's lm_loss_func."""
    from functools import partial

    def forward(batch):
        return net(batch[0]).squeeze(-1) ** 2, partial(lm_loss_func, batch[1], per_token=per_token)
    return forward


@pytest.mark.parametrize("jit", [True, False], ids=["compiled", "eager"])
def test_per_token_loss_is_the_mean_over_every_token_of_the_step(jit):
    """--calculate-per-token-loss (Megatron's): three micro-batches whose loss masks keep 5, 1 and
    3 tokens. The step's loss and gradient (read from one SGD update, lr 1) are those of the mean
    over the 9 tokens (numpy), not of the mean of the micro-batches' means, the default's."""
    from mindspore import nn

    from rapidgpt.optim import SGD

    make_engine()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 6, 4)).astype(np.float32)
    mask = np.zeros((3, 6), np.float32)
    mask[0, :5], mask[1, 2], mask[2, 1:4] = 1, 1, 1
    w0 = rng.standard_normal((1, 4)).astype(np.float32)
    token_loss = (x @ w0[0]) ** 2                                                   # [3, 6]
    token_grad = 2 * (x @ w0[0])[..., None] * x                                     # [3, 6, 4]
    expected = {True: ((token_loss * mask).sum() / mask.sum(),
                       (token_grad * mask[..., None]).sum((0, 1)) / mask.sum()),
                False: (np.mean([(token_loss[i] * mask[i]).sum() / mask[i].sum() for i in range(3)]),
                        np.mean([(token_grad[i] * mask[i][:, None]).sum(0) / mask[i].sum() for i in range(3)], 0))}
    for per_token, (loss, grad) in expected.items():
        net = nn.Dense(4, 1, has_bias=False)
        net.weight.set_data(Tensor(w0))

        step = TrainStep(_squared_forward(net, per_token), OptimizerWrapper.around(SGD(net.trainable_params(), 1.0, momentum=0.0)), 3,
                         jit=jit, per_token=per_token)
        result = step((Tensor(x), Tensor(mask)), 1.0, 1)
        assert result.loss == pytest.approx(loss, rel=1e-5), per_token
        np.testing.assert_allclose(w0[0] - net.weight.asnumpy()[0], grad, rtol=1e-5, err_msg=str(per_token))
    assert not np.isclose(expected[True][0], expected[False][0], rtol=1e-3)      # the test can tell them apart


def test_the_compile_call_depth_limit_grows_with_the_parameters_and_never_shrinks(monkeypatch):
    """MindSpore unrolls loops over the parameters into nested calls and stops at 1000 levels by
    default: a 32-layer GPT with ZeRO-1 (388 parameters) stopped at its first step with "Exceed
    function call depth limit 1000" (measured by hand; 8 layers need 300-375, 16 at most 700).
    Compiling such a model takes minutes here, so this checks the rule, not a compile."""
    import mindspore as ms
    from rapidgpt.training import step
    limits = []
    monkeypatch.setattr(ms, "set_recursion_limit", limits.append)
    monkeypatch.setattr(step, "_call_depth", step.DEFAULT_CALL_DEPTH)
    step.allow_call_depth_for(388)
    step.allow_call_depth_for(100)              # a smaller graph later in the process: kept
    step.allow_call_depth_for(500)
    assert limits == [1000 + 6 * 388, 1000 + 6 * 500]
    assert limits[0] >= 2 * 375 / 100 * 388     # twice the measured need per parameter
