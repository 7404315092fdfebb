"""Knowledge distillation (Megatron's ModelOpt distillation flags, rapidgpt/config/distillation.py and
rapidgpt/models/distillation.py): its losses against a numpy port of ModelOpt's, its flag checks,
and Megatron's functional test gpt3_mcore_te_tp2_pp1_modelopt_distill_resume at TP=2 with sequence
parallelism printing the single process's run."""
import re

import numpy as np
import pytest

from batched_runs import msrun
from rapidgpt.arguments import parse_args
from test_parallel import assert_same_run, checkpoint_of, single

# Megatron's DISTILL_CONFIG of gpt3_mcore_te_tp2_pp1_modelopt_distill_resume, with two more pairs of the shapes
# its examples/post_training/modelopt/distillation.md shows (a layer's input norm; a layer's output, by MSE).
DISTILL_CFG = """intermediate_layer_pairs:
- - decoder.final_layernorm
  - decoder.final_layernorm
- [decoder.layers.0.input_layernorm, decoder.layers.1.input_layernorm]
- [decoder.layers.1, decoder.layers.2, mse]
logit_layers:
- output_layer
- output_layer
skip_lm_loss: true
kd_loss_scale: 1.0
"""


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def cosine_loss(a, b):
    """torch's cosine_embedding_loss with target 1, per token."""
    return 1 - (a * b).sum(-1) / np.sqrt(((a ** 2).sum(-1) + 1e-12) * ((b ** 2).sum(-1) + 1e-12))


def modelopt_losses(student_logits, teacher_logits, pairs, mask, temperature, skip_lm_loss, kd_loss_scale, lm):
    """ModelOpt's LogitsKLLoss, its intermediate losses on `pairs` [(student state, teacher state, loss
    function)] and LogitsAndIntermediatesLossBalancer on one micro-batch (Megatron's _mask_loss: sums
    over the masked tokens), float64."""
    p, q = log_softmax(student_logits / temperature), log_softmax(teacher_logits / temperature)
    kl = (np.exp(q) * (q - p)).sum(-1)                                     # F.kl_div(p, q, log_target=True)
    per_pair = [loss(a, b) for a, b, loss in pairs]
    logits_loss, lm_loss = (kl * mask).sum(), (lm * mask).sum()
    intermediate = sum((x * mask).sum() for x in per_pair) / len(per_pair)
    total = logits_loss + (intermediate * logits_loss / intermediate if intermediate > 0 else intermediate)
    if not skip_lm_loss:
        total = lm_loss + (total * lm_loss / total if total > 0 and lm_loss > 0 else total) * kd_loss_scale
    return kl, per_pair, {"lm loss": lm_loss, "total loss": total, "logits distillation loss": logits_loss,
                          "intermediate distillation loss": intermediate}


@pytest.mark.parametrize("skip_lm_loss", [True, False], ids=["skip-lm-loss", "with-lm-loss"])
def test_distillation_losses_are_modelopts(skip_lm_loss):
    """A 1-layer student and a 2-layer teacher over a padded vocabulary (100 of 128 rows), temperature
    2, three pairs (the final norms'; the student's first layer's input norm against the teacher's
    second's; the first layers' outputs by MSE), the states taken by calling the layers one by one:
    the per-token KL and pair losses and the balanced total equal the numpy port within 1e-5,
    the lm loss is zero in training with skip_lm_loss (Megatron logs 0) and the student's loss in
    evaluation, which is then what is trained on."""
    from mindspore import Tensor

    from rapidgpt.config.distillation import DistillationConfig
    from rapidgpt.models.distillation import DistillationModel, distillation_loss_func
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.parallel.random import initialize_parameters

    base = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "12",
            "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0", "--attention-dropout", "0"]
    student = build_gpt_model(parse_args(argv=base), 100)
    teacher = build_gpt_model(parse_args(argv=[*base[:1], "2", *base[2:]]), 100)
    initialize_parameters(student, 1)
    initialize_parameters(teacher, 2)
    assert student.padded_vocab_size == 128
    pairs = (("decoder.final_layernorm", "decoder.final_layernorm", "cosine"),
             ("decoder.layers.0.input_layernorm", "decoder.layers.1.input_layernorm", "cosine"),
             ("decoder.layers.0", "decoder.layers.0", "mse"))
    config = DistillationConfig("unused", {}, pairs, skip_lm_loss=skip_lm_loss, kd_loss_scale=3.0,
                                logit_kl_temperature=2.0)
    rng = np.random.default_rng(0)
    tokens = Tensor(rng.integers(0, 100, (2, 12)).astype(np.int32))
    labels = Tensor(rng.integers(0, 100, (2, 12)).astype(np.int32))
    mask = (rng.random((2, 12)) > 0.3).astype(np.float32)
    reference_logits = [m(tokens).asnumpy().astype(np.float64) for m in (student, teacher)]
    final = [m.hidden_states(tokens).asnumpy().astype(np.float64) for m in (student, teacher)]
    # The layers' states computed by calling each layer cell in turn.
    states = []
    for m in (student, teacher):
        x = m.embed(tokens, Tensor(np.arange(12, dtype=np.int32)))
        layers = list(m.layers.cell_list)
        inputs = [x]
        for layer in layers:
            inputs.append(layer(inputs[-1]))
        states.append(([layer.input_layernorm(x).asnumpy().astype(np.float64) for layer, x in zip(layers, inputs)],
                       [x.asnumpy().astype(np.float64) for x in inputs[1:]]))
    (student_norms, student_outputs), (teacher_norms, teacher_outputs) = states
    mse = lambda a, b: ((a - b) ** 2).mean(-1)          # noqa: E731
    compared = [(final[0], final[1], cosine_loss), (student_norms[0], teacher_norms[1], cosine_loss),
                (student_outputs[0], teacher_outputs[0], mse)]
    lm = student(tokens, None, None, labels).asnumpy().astype(np.float64)
    model = DistillationModel(student, teacher, config)
    assert not [p.name for p in teacher.get_parameters() if not p.name.startswith("kd_teacher.") or p.requires_grad]
    for training in (True, False):
        model.set_train(training)
        assert not model.teacher.training
        output = model(tokens, None, None, labels)
        loss, tokens_counted, stats = distillation_loss_func(skip_lm_loss, 3.0, training, Tensor(mask), output)
        kl, per_pair, expected = modelopt_losses(*reference_logits, compared, mask, 2.0, skip_lm_loss, 3.0,
                                                 np.zeros_like(lm) if training and skip_lm_loss else lm)
        np.testing.assert_allclose(output[1].asnumpy(), kl, rtol=1e-5, atol=1e-6)
        assert len(output[2]) == 3
        for found, reference in zip(output[2], per_pair):
            np.testing.assert_allclose(found.asnumpy(), reference, rtol=1e-5, atol=1e-6)
        for name, value in expected.items():
            # sums over 17 tokens of fp32 KLs near 0.003 (each within ~1e-6 of float64's)
            np.testing.assert_allclose(float(stats[name].asnumpy()), value, rtol=1e-5, atol=2e-5, err_msg=name)
        assert float(tokens_counted.asnumpy()) == mask.sum()
        trained = expected["total loss"] if training else expected["lm loss"]
        np.testing.assert_allclose(float(loss.asnumpy()), trained, rtol=1e-5, atol=2e-5)
        assert (float(stats["lm loss"].asnumpy()) == 0.0) == (training and skip_lm_loss)


def test_the_kl_gradient_is_softmax_minus_the_teachers_probabilities():
    """d KL / d student logits = (softmax(s / T) - softmax(t / T)) / T on the true vocabulary, 0 on
    the padding rows, as ModelOpt's loss differentiated by torch."""
    import mindspore as ms
    from mindspore import Tensor

    from rapidgpt.models.distillation import LogitsKLLoss

    rng = np.random.default_rng(1)
    student, teacher = rng.normal(size=(6, 16)).astype(np.float32), rng.normal(size=(6, 16)).astype(np.float32)
    kl = LogitsKLLoss(13, 16, temperature=1.5)
    grad = ms.grad(lambda s: kl(s, Tensor(teacher)).sum())(Tensor(student)).asnumpy()
    softmax = [np.exp(log_softmax(x[:, :13].astype(np.float64) / 1.5)) for x in (student, teacher)]
    np.testing.assert_allclose(grad[:, :13], (softmax[0] - softmax[1]) / 1.5, rtol=1e-5, atol=1e-7)
    assert not grad[:, 13:].any()


def errors(capsys, argv):
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "pretraining", "--train-iters", "4", *argv])
    return capsys.readouterr().err


def test_distillation_flags_are_checked(capsys, tmp_path):
    """Each mistake is one line naming the flag and what to do."""
    assert "--export-kd-cfg: a distillation setting; add --export-kd-teacher-load" in errors(
        capsys, ["--export-kd-cfg", "x.yaml"])
    megatron = tmp_path / "megatron"
    (megatron / "iter_0000010" / "mp_rank_00").mkdir(parents=True)
    (megatron / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"")
    assert (f"--export-kd-teacher-load: {megatron} is a Megatron-LM checkpoint; convert it first (python "
            f"data_tools/convert_megatron.py --load {megatron} --save OUT) and give OUT") in errors(
        capsys, ["--export-kd-teacher-load", str(megatron)])
    assert "--export-kd-teacher-load: distillation with pipeline stages is not built" in errors(
        capsys, ["--export-kd-teacher-load", str(tmp_path), "--pipeline-model-parallel-size", "2"])
    cfg = tmp_path / "kd.yaml"
    cfg.write_text("intermediate_layer_pairs: [[decoder.layers.3.mlp, decoder.layers.5]]\nkd_loss_scael: 2\n")
    err = errors(capsys, ["--export-kd-teacher-load", str(tmp_path), "--export-kd-cfg", str(cfg)])
    assert "--export-kd-cfg: unknown setting(s) kd_loss_scael; the settings are" in err
    assert "--export-kd-cfg: intermediate layer 'decoder.layers.3.mlp' is not built" in err


# Megatron's gpt3_mcore_te_tp2_pp1_modelopt_distill_resume (d98e8a6), every flag but the paths, sizes made tiny
# and --bf16 left out (the layouts are compared in fp32); its DISTILL_CONFIG is DISTILL_CFG above.
DISTILL_CONFIG = ["--export-te-mcore-model", "--auto-detect-ckpt-format", "--num-layers", "2", "--hidden-size", "32",
                  "--num-attention-heads", "4", "--normalization", "RMSNorm", "--log-params-norm",
                  "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard",
                  "--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "32",
                  "--max-position-embeddings", "32", "--position-embedding-type", "rope", "--no-rope-fusion",
                  "--rotary-percent", "0.5", "--swiglu", "--untie-embeddings-and-output-weights",
                  "--disable-bias-linear", "--train-iters", "6", "--timing-log-level", "0", "--lr-decay-iters",
                  "320000", "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015",
                  "--lr-decay-style", "cosine", "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0",
                  "--lr-warmup-fraction", ".01", "--use-distributed-optimizer", "--log-interval", "1",
                  "--save-interval", "50", "--eval-interval", "3", "--eval-iters", "2", "--transformer-impl",
                  "transformer_engine", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
                  "--sequence-parallel", "--deterministic-mode", "--no-gradient-accumulation-fusion",
                  "--use-checkpoint-opt_param-scheduler", "--ckpt-format", "torch_dist", "--dist-ckpt-strictness",
                  "log_all", "--attention-backend", "unfused", "--log-memory-to-tensorboard", "--async-save",
                  "--use-persistent-ckpt-worker", "--exit-interval", "100", "--no-progress-bar", "--max-new-tokens", "0",
                  "--hidden-dropout", "0.1", "--seed", "5"]
KD_VALUES = re.compile(r"(lm loss|total loss|logits distillation loss|intermediate distillation loss|grad norm)"
                       r"(?: value)?: ([\d.E+-]+)")


@pytest.mark.ranks
def test_megatrons_distillation_functional_test_at_tp2_prints_the_single_process_run(env, tmp_path):
    """A 3-layer teacher trained and saved; the functional test's 2-layer student (RMSNorm, SwiGLU,
    half-rotary RoPE, an untied output layer, dropout) distilled from it with its DISTILL_CONFIG
    (logits KL plus the final norms' cosine, skip_lm_loss) at TP=2 with sequence parallelism and the
    distributed optimizer, and in one process: every logged loss, grad norm and validation value
    within 1e-5; "lm loss" 0 in training and the student's in validation, as in Megatron's golden values."""
    teacher = tmp_path / "teacher"
    shape = DISTILL_CONFIG[DISTILL_CONFIG.index("--normalization"):DISTILL_CONFIG.index("--log-params-norm")] + \
        ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32", "--max-position-embeddings", "32",
         "--position-embedding-type", "rope", "--rotary-percent", "0.5", "--swiglu",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
    status, log = single(["--task", "pretraining", "--num-layers", "3", *shape, "--micro-batch-size", "2",
                          "--global-batch-size", "8", "--train-iters", "4", "--lr", "1e-3", "--save", str(teacher),
                          "--save-interval", "4", "--eval-iters", "0", "--no-progress-bar", "--max-new-tokens", "0"], env)
    assert status == 0, log[-3000:]
    cfg = tmp_path / "distill_config.yaml"
    cfg.write_text(DISTILL_CFG)
    distill = ["--task", "pretraining", *DISTILL_CONFIG, "--export-kd-teacher-load", str(teacher), "--export-kd-cfg",
               str(cfg)]
    status, reference_log = single([*distill, "--tensor-model-parallel-size", "1", "--save", str(tmp_path / "single"),
                                    "--save-interval", "3"], env)
    assert status == 0, reference_log[-3000:]
    assert " > knowledge distillation from " in reference_log
    assert " the teacher's model flags that differ from the student's: --num-layers 3" in reference_log
    reference = [(name, float(value)) for name, value in KD_VALUES.findall(reference_log)]
    training = [line for line in reference_log.splitlines() if line.startswith(" iteration ")]
    assert len(training) == 6 and all("| lm loss: 0.000000E+00 |" in line for line in training), training
    validation = [line for line in reference_log.splitlines() if "validation loss at" in line]
    assert validation and all(float(v) > 1 for v in re.findall(r"\| lm loss value: ([\d.E+-]+)", "\n".join(validation)))
    status, log = msrun(2, ["rapidgpt/cli.py", *distill, "--save", str(tmp_path / "tp2")], tmp_path / "logs", env)
    assert status == 0, log[-3000:]
    assert_same_run([(name, float(value)) for name, value in KD_VALUES.findall(log)], reference)
    assert "successfully saved checkpoint at iteration       6" in log
    # The functional test is a resume test: from the single process's iteration-3 checkpoint (the teacher
    # read again from --export-kd-teacher-load, not from the student's checkpoint), iterations 4-6 again.
    checkpoint = checkpoint_of(tmp_path / "single", 3, tmp_path / "resume")
    status, log = single([*distill, "--tensor-model-parallel-size", "1", "--load", checkpoint, "--save",
                          str(tmp_path / "resumed")], env)
    assert status == 0, log[-3000:]
    assert " loaded checkpoint from " in log and "at iteration 3" in log
    assert iteration_values(log) == pytest.approx({i: v for i, v in iteration_values(reference_log).items() if i > 3},
                                                  rel=1e-5)


def iteration_values(log):
    """{iteration: [its logged losses and grad norm]}."""
    return {int(re.search(r" iteration\s+(\d+)/", line).group(1)): [float(v) for _, v in KD_VALUES.findall(line)]
            for line in log.splitlines() if line.startswith(" iteration ")}
