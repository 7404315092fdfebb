"""Mixed precision (fp16 with Megatron's loss scaler), its checkpoints, and activation recompute,
in one process. Multi-rank equivalence: tests/test_parallel.py."""
import json
import math
import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from rapidgpt.arguments import parse_args
from rapidgpt.config.precision import PrecisionConfig
from rapidgpt.optim import DynamicGradScaler, OptimizerWrapper, SGD
from rapidgpt.tasks.pretraining import main as pretrain_main
from rapidgpt.tasks.text_generation import main as generation_main
from rapidgpt.training.checkpoint_files import find_checkpoint
from rapidgpt.training.checkpointing import gathered_tensors
from rapidgpt.training.step import TrainStep
from tensorboard_events import scalars

# The demo corpus, a tiny GPT, dropout on.
TINY = ["--task", "pretraining", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
        "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "0", "--hidden-dropout", "0.1",
        "--attention-dropout", "0.1", "--no-progress-bar", "--max-new-tokens", "0", "--seed", "5"]
LINE = re.compile(r" iteration\s+(\d+)/.*?\|(?: lm loss: ([\d.E+-]+) \|)? loss scale: ([\d.]+) \|"
                  r"(?: grad norm: ([\d.]+) \|)?(?: num zeros: [\d.]+ \|)?(?: params norm: [\d.]+ \|)?"
                  r" number of skipped iterations:\s+(\d+) \| number of nan iterations:\s+(\d+)")


pytestmark = pytest.mark.usefixtures("demo_cache")          # tests/conftest.py


def run(capsys, *argv):
    """{iteration: (lm loss or None, loss scale, grad norm or None, skipped, nan)} from the log."""
    assert pretrain_main(TINY + list(argv)) == 0
    out = capsys.readouterr().out
    lines = {int(m.group(1)): m.groups()[1:] for m in LINE.finditer(out)}
    assert lines, out
    return lines, out


# ---- the loss scaler against a line-by-line port of Megatron's rule ------------------------------

class MegatronDynamicGradScaler:
    """megatron/core/optimizer/grad_scaler.py DynamicGradScaler.update, line by line."""

    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor, growth_interval, hysteresis):
        self._scale = initial_scale
        self.min_scale = min_scale
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0
        self._hysteresis_tracker = self.hysteresis

    def update(self, found_inf):
        # If we have an inf/nan, growth tracker is set to 0
        # and hysterisis tracker is reduced by 1.
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            # Now if we are out of hysteresis count, scale down the loss.
            if self._hysteresis_tracker <= 0:
                self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        else:
            # If there is no nan/inf, increment the growth tracker.
            self._growth_tracker += 1
            # If we have had enough consequitive intervals with no nan/inf:
            if self._growth_tracker == self.growth_interval:
                # Reset the tracker and hysteresis trackers,
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                # and scale up the loss scale.
                self._scale = self._scale * self.growth_factor


SEQUENCES = {
    "consecutive overflows to the floor": [True] * 12 + [False] * 7,
    "scattered overflows": [True, False, False, True, False, True, True, False, False, False, True, False] * 3,
    "growth, then overflow, then growth": [False] * 9 + [True] + [False] * 10 + [True, True] + [False] * 8,
    "hysteresis reset only by growth": [True, False, False, False, True, False, True, True, True, False] * 2,
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_dynamic_scaler_follows_megatrons_rule_step_by_step(name):
    ours = DynamicGradScaler(initial_scale=2.0 ** 10, min_scale=64.0, growth_interval=4, hysteresis=2)
    megatron = MegatronDynamicGradScaler(2.0 ** 10, 64.0, 2.0, 0.5, 4, 2)
    for step, found_inf in enumerate(SEQUENCES[name]):
        ours.update(Tensor(found_inf))
        megatron.update(found_inf)
        assert (float(ours.scale), int(ours.growth_tracker), int(ours.hysteresis_tracker)) == \
            (megatron._scale, megatron._growth_tracker, megatron._hysteresis_tracker), (name, step)


def test_the_scaler_inside_a_compiled_step_skips_overflows_without_touching_anything():
    """An overflowing fp16 step: no update of weights or optimizer state, the scale follows the rule."""
    net = nn.Dense(4, 1)
    net.weight.set_data(Tensor(np.full((1, 4), 0.5, np.float32)))
    net.bias.set_data(Tensor(np.zeros(1, np.float32)))
    for p in net.get_parameters():
        p.set_dtype(ms.float16)
    precision = PrecisionConfig(params_dtype="float16", initial_loss_scale=2.0 ** 10, hysteresis=1,
                                loss_scale_window=2, accumulate_allreduce_grads_in_fp32=False)
    wrapper = OptimizerWrapper.around(SGD(net.trainable_params(), 0.1, momentum=0.0), 0.0, precision)

    def forward(batch):
        return net(batch[0]).astype(ms.float32).sum()

    step = TrainStep(forward, wrapper, 1)
    x = Tensor(np.ones((1, 2, 4), np.float16) * 100)   # d loss / d w = 200: fits fp16 (65504) at scale 256
    before = wrapper.main_params[0].asnumpy().copy()
    results = [step((x,), 0.1, i) for i in range(1, 7)]
    assert [r.updated for r in results] == [False, False, True, True, False, True]
    assert [r.loss_scale for r in results] == [512, 256, 256, 512, 256, 256]      # window 2: grows once
    np.testing.assert_array_equal(wrapper.main_params[0].asnumpy(), before - 3 * 0.1 * 200)
    assert net.weight.dtype == ms.float16 and wrapper.main_params[0].dtype == ms.float32
    np.testing.assert_array_equal(net.weight.asnumpy(), wrapper.main_params[0].asnumpy().astype(np.float16))


def test_round_to_bf16_is_round_to_nearest_even_and_so_is_its_gradient():
    """rapidgpt.emulated_bf16.round_to_bf16 against the bit rule (ties to the even bf16 value)."""
    from rapidgpt.emulated_bf16 import round_to_bf16

    def reference(x):
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)

    tie_down, tie_up = np.uint32(0x3F808000).view(np.float32), np.uint32(0x3F818000).view(np.float32)
    x = np.concatenate([[tie_down, tie_up, 1.0, -3.0e-3, 65504.0 * 3],
                        np.random.default_rng(0).standard_normal(1000) * 10]).astype(np.float32)
    assert list(reference(np.array([tie_down, tie_up])).view(np.uint32)) == [0x3F800000, 0x3F820000]   # to even
    cotangent = (np.random.default_rng(1).standard_normal(x.size) * 3).astype(np.float32)

    def loss(value):
        return (round_to_bf16(value) * Tensor(cotangent)).sum()

    value, grad = ms.value_and_grad(loss)(Tensor(x))
    np.testing.assert_array_equal(round_to_bf16(Tensor(x)).asnumpy(), reference(x))
    np.testing.assert_array_equal(grad.asnumpy(), reference(cotangent))


@pytest.mark.parametrize("grad_reduce_in_bf16", [False, True])
def test_emulated_bf16_sums_weight_gradients_in_fp32_or_as_a_bf16_buffer(grad_reduce_in_bf16):
    """Two micro-batches of `loss = sum(w * x_i)` (gradient x_i / 2, with many mantissa bits):
    summed in fp32 as Megatron's fp32 main gradients, or with --grad-reduce-in-bf16 rounded as a bf16
    buffer holds them (each micro-batch's, then their sum); the model's weights are bf16 values of
    the fp32 main ones after the update."""
    from rapidgpt.emulated_bf16 import emulate_bf16

    def bf16(x):
        bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)

    class Linear(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = ms.Parameter(Tensor(np.array([0.3, -1.7, 2.2, 5.1], np.float32)), name="weight")

        def construct(self, x):
            return (self.weight * x).sum()

    net = Linear()
    assert emulate_bf16(net) == ["Linear"]           # not RapidGPT's: its results are not rounded
    precision = PrecisionConfig(params_dtype="bfloat16", emulated_bf16=True,
                                accumulate_allreduce_grads_in_fp32=not grad_reduce_in_bf16)
    wrapper = OptimizerWrapper.around(SGD(net.trainable_params(), 1.0, momentum=0.0), 0.0, precision)
    def forward(batch):
        return net(batch[0])

    step = TrainStep(forward, wrapper, 2, precision.accumulate_allreduce_grads_in_fp32)
    x = np.array([[1.0 + 2 ** -9, 3.0 + 2 ** -7, -0.1, 7.77], [2.0 ** -9, 1.001, 0.30103, -2.5]], np.float32)
    before = wrapper.main_params[0].asnumpy().copy()
    step((Tensor(x),), 1.0, 1)
    halves = x * np.float32(0.5)
    grad = bf16(bf16(halves[0]) + bf16(halves[1])) if grad_reduce_in_bf16 else halves[0] + halves[1]
    np.testing.assert_array_equal(wrapper.main_params[0].asnumpy(), before - grad)
    np.testing.assert_array_equal(net.weight.asnumpy(), bf16(before - grad))
    assert (bf16(bf16(halves[0]) + bf16(halves[1])) != halves[0] + halves[1]).any()      # the test can tell


def test_bf16_on_the_cpu_is_emulated_near_fp32_and_resumes_exactly(tmp_path, capsys):
    """--bf16 on the CPU backend (no bf16 kernels): emulated (the layers' rounding: tests/test_llama.py).
    It trains near the fp32 run but not as it, its checkpoints hold the fp32 main weights (not bf16
    values), and a resume, whose model weights are rounded again from those, continues exactly."""
    args = ["--train-iters", "8", "--bf16", "--lr-decay-iters", "20"]
    full, out = run(capsys, *args)
    assert " > precision: emulated bf16 (fp32 tensors holding bf16 values: the CPU backend has no bf16 kernels) " \
           "parameters and activations, fp32 main parameters and optimizer state; no loss scaling" in out
    fp32, _ = run(capsys, "--train-iters", "8", "--lr-decay-iters", "20")
    losses = np.array([[float(lines[i][0]) for i in range(1, 9)] for lines in (full, fp32)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=2e-2)
    assert np.abs(losses[0] - losses[1]).max() > 1e-5
    save = str(tmp_path / "ckpt")
    run(capsys, *args, "--save", save, "--save-interval", "4", "--exit-interval", "4")
    resumed, _ = run(capsys, *args, "--load", save)
    assert {i: full[i] for i in range(5, 9)} == resumed
    weights = gathered_tensors(save)["layers.0.mlp.dense_h_to_4h.weight"]
    assert weights.dtype == np.float32 and np.any(weights.view(np.uint32) & 0xFFFF)


# ---- fp16 training through the engine -----------------------------------------------------------

def expected_scales(skipped, iterations, precision=PrecisionConfig(params_dtype="float16")):
    """Megatron's scale after each iteration when exactly the iterations in `skipped` overflowed."""
    rule = MegatronDynamicGradScaler(precision.initial_loss_scale, precision.min_loss_scale, 2.0, 0.5,
                                     precision.loss_scale_window, precision.hysteresis)
    scales = {}
    for i in range(1, iterations + 1):
        rule.update(i in skipped)
        scales[i] = rule._scale
    return scales


def test_fp16_from_2_pow_32_skips_as_the_rule_predicts_then_trains_like_fp32(capsys):
    fp16, _ = run(capsys, "--train-iters", "100", "--fp16")
    fp32, _ = run(capsys, "--train-iters", "100")
    skipped = {i for i, line in fp16.items() if line[3] == "1"}
    first_update = min(set(fp16) - skipped)
    assert skipped == set(range(1, first_update)) and first_update > 2      # a run of overflows, then none
    assert {i: float(line[1]) for i, line in fp16.items()} == expected_scales(skipped, 100)
    assert all(line[0] is None and line[2] is None for i, line in fp16.items() if i in skipped)
    assert all(line[4] == "0" for line in fp16.values())                     # no NaN loss anywhere
    assert all(math.isfinite(float(line[0])) for i, line in fp16.items() if i not in skipped)
    assert float(fp16[100][0]) == pytest.approx(float(fp32[100][0]), rel=0.02)
    assert all(line[1] == "1.0" and line[3] == "0" for line in fp32.values())


def assert_adam_continued(before, after, beta1=0.9, beta2=0.999):
    """`after` (a checkpoint one step after `before`) continued `before`'s Adam state: its step
    count is one more, and each moment pair follows Adam's recurrence from `before`'s with one
    gradient g: m' = b1 m + (1 - b1) g and v' = b2 v + (1 - b2) g^2, so the g the first moments
    imply squares to the g^2 the second imply. (A run that started its moments afresh has m' =
    (1 - b1) g: the g implied with `before`'s m is then off by b1 / (1 - b1) m.)"""
    assert int(after["adam_step"]) == int(before["adam_step"]) + 1
    moments = [name[len("adam_m."):] for name in before if name.startswith("adam_m.")]
    assert moments and all(f"adam_v.{name}" in after for name in moments)
    for name in moments:
        m, v = before[f"adam_m.{name}"].astype(np.float64), before[f"adam_v.{name}"].astype(np.float64)
        m1, v1 = after[f"adam_m.{name}"].astype(np.float64), after[f"adam_v.{name}"].astype(np.float64)
        g_squared = ((m1 - beta1 * m) / (1 - beta1)) ** 2
        np.testing.assert_allclose(g_squared, (v1 - beta2 * v) / (1 - beta2), rtol=1e-3,
                                   atol=1e-3 * float(g_squared.max()), err_msg=name)


def test_fp16_resumes_exactly_and_its_checkpoints_are_precision_free(tmp_path, capsys):
    """Also Megatron's --log-num-zeros-in-grad and --log-params-norm (both resume bit for bit): the
    params norm is the fp32 main weights' (numpy, on the checkpoint); the zeros, counted on updated
    iterations only, include every padded vocabulary row's gradient (their logits are masked).
    Exact counts against numpy: tests/test_optim.py."""
    args = ["--train-iters", "24", "--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "3",
            "--lr-decay-iters", "40", "--log-num-zeros-in-grad", "--log-params-norm"]
    full, out = run(capsys, *args, "--tensorboard-dir", str(tmp_path / "full"))
    assert re.search(r"\| grad norm: [\d.]+ \| num zeros: \d+\.0 \| params norm: [\d.]+ \| number of skipped", out)
    save = str(tmp_path / "ckpt")
    run(capsys, *args, "--save", save, "--save-interval", "12", "--exit-interval", "12")
    resumed, _ = run(capsys, *args, "--load", save, "--save", save, "--tensorboard-dir", str(tmp_path / "resumed"))
    assert {i: full[i] for i in range(13, 25)} == resumed          # loss, scale, grad norm, to the digit
    for tag in ("lm_loss", "loss-scale", "grad-norm", "num-zeros", "params-norm"):   # float32 values, bit for bit
        expected = {i: v for i, v in scalars(tmp_path / "full", tag).items() if i > 12}
        assert expected and scalars(tmp_path / "resumed", tag) == expected, tag
    assert len({line[1] for line in full.values()}) > 2            # the scale moved (grew) on the way
    weights = gathered_tensors(save)
    assert weights["layers.0.mlp.dense_h_to_4h.weight"].dtype == np.float32      # the fp32 main weights
    assert float(weights["grad_scaler.scale"]) == float(full[24][1])
    model = {name: w for name, w in weights.items() if w.dtype == np.float32 and w.ndim > 0 and "." in name
             and not name.startswith(("adam_", "grad_scaler"))}
    norm = np.sqrt(sum((w.astype(np.float64) ** 2).sum() for w in model.values()))
    assert scalars(tmp_path / "full", "params-norm")[24] == pytest.approx(norm, rel=1e-6)
    embedding = weights["word_embeddings.weight"]
    vocab_size = json.loads(Path(find_checkpoint(save), "metadata.json").read_text())["vocab_size"]
    padded_elements = (embedding.shape[0] - vocab_size) * embedding.shape[1]
    zeros = scalars(tmp_path / "full", "num-zeros")
    assert all(count >= padded_elements for count in zeros.values())   # and fp16 gradients that underflowed
    assert sorted(zeros) == [i for i, line in full.items() if line[3] == "0"] != list(range(1, 25))  # skipped: none

    # An fp16 checkpoint resumes in fp32 (its main weights and Adam state), and the reverse.
    as_fp32, _ = run(capsys, "--train-iters", "28", "--lr-decay-iters", "40", "--load", save,
                     "--save", str(tmp_path / "fp32"), "--save-interval", "1")
    assert sorted(as_fp32) == [25, 26, 27, 28]
    assert float(as_fp32[25][0]) == pytest.approx(float(full[24][0]), rel=0.05)
    assert_adam_continued(weights, gathered_tensors(str(tmp_path / "fp32" / "iter_0000025")))
    back, _ = run(capsys, "--train-iters", "30", "--lr-decay-iters", "40", "--fp16", "--load", str(tmp_path / "fp32"))
    assert sorted(back) == [29, 30] and back[29][1] == "4294967296.0"      # a fresh scaler: not in fp32 checkpoints
    assert generation_main(TINY[2:] + ["--task", "text_generation", "--load", save, "--prompt", "a",
                                       "--max-new-tokens", "4", "--fp16"]) == 0
    assert "continuation" in capsys.readouterr().out


# ---- recompute -----------------------------------------------------------------------------------

RECOMPUTE = {
    "full uniform 1 (--checkpoint-activations)": ["--checkpoint-activations"],
    "full uniform 2": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
    "full block 3": ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"],
    "selective": ["--recompute-activations"],
}
# The compiled step's --recompute-activations is also compared with the run without recompute on TP=2
# (tests/test_parallel.py), --checkpoint-activations on pipeline stages (test_pipeline.py).
COMPILED_ONLY_HERE = ("full uniform 2", "full block 3")


@pytest.mark.parametrize("jit", [True, False])
def test_recompute_gives_bitwise_the_same_losses_and_grad_norms(capsys, jit):
    mode = ["--train-iters", "3", "--global-batch-size", "8"] if jit else ["--no-jit", "--train-iters", "2"]
    reference, _ = run(capsys, *mode)         # 4 micro-batches compiled, 2 eager
    for name, flags in RECOMPUTE.items():
        if jit and name not in COMPILED_ONLY_HERE:
            continue
        lines, out = run(capsys, *mode, *flags)
        assert lines == reference, name


# ---- a white-box user's own nn.Cell -----------------------------------------------------------------

class UserModel(nn.Cell):
    """No RapidGPT layer: MindSpore's Dense/LayerNorm/GELU, its blocks in a `layers` list."""

    def __init__(self, with_layer_list=True):
        super().__init__()
        self.embed = nn.Dense(8, 16)
        blocks = [nn.SequentialCell(nn.LayerNorm((16,)), nn.Dense(16, 16), nn.GELU()) for _ in range(3)]
        # Without a `layers` list (refused for recompute before anything runs) they are `blocks`.
        setattr(self, "layers" if with_layer_list else "blocks", nn.CellList(blocks))
        self.head = nn.Dense(16, 1)

    def construct(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = x + layer(x)
        return ops.square(self.head(x)).mean()


def _compose_user_model(*flags, with_layer_list=True):
    from rapidgpt.engine import RapidGPTEngine
    engine = RapidGPTEngine(argv=["--train-iters", "10", "--lr", "1e-2", "--seed", "1"] + list(flags))
    model = UserModel(with_layer_list)
    rng = np.random.default_rng(0)
    for p in model.get_parameters():              # the same start for every variant
        p.set_data(Tensor(rng.normal(0, 0.3, p.shape).astype(np.float32)))
    return engine.compose(model)


def test_a_users_own_cell_trains_in_fp16_with_amp_and_full_recompute_of_its_layer_list():
    x = Tensor(np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32))
    runs = {}
    for name, flags in {"fp16": ["--fp16", "--initial-loss-scale", "1024"],
                        "fp16 recompute": ["--fp16", "--initial-loss-scale", "1024", "--checkpoint-activations"],
                        "fp32": []}.items():
        model, optimizer, scheduler, _ = _compose_user_model(*flags)
        runs[name] = [optimizer.step(model, x) for _ in range(4)]
        assert optimizer.last_updated
        if name != "fp32":
            assert {p.dtype for p in model.get_parameters()} == {ms.float16}
            assert {p.dtype for p in optimizer.optimizer.main_params} == {ms.float32}
    assert runs["fp16 recompute"] == runs["fp16"]                      # bitwise
    np.testing.assert_allclose(runs["fp16"], runs["fp32"], rtol=5e-3)


def test_recompute_of_a_cell_without_a_layer_list_or_rapidgpt_attention_is_refused():
    from rapidgpt.training.model_transforms import ModelTransformError
    with pytest.raises(ModelTransformError, match="has no `layers` list to recompute; keep its transformer "
                                                  "layers in `self.layers = nn.CellList"):
        _compose_user_model("--checkpoint-activations", with_layer_list=False)
    with pytest.raises(ModelTransformError, match="selective: the model \\(UserModel\\) has no RapidGPT attention"):
        _compose_user_model("--recompute-activations")


def test_an_optimizer_that_cannot_be_rebuilt_over_fp32_main_parameters_is_refused():
    from types import SimpleNamespace
    from rapidgpt.config.zero import ZeroConfig
    from rapidgpt.optim.mixed_precision import OptimizerRebuildError, wrap_optimizer
    net = nn.Dense(2, 2)
    foreign = SimpleNamespace(parameters=net.trainable_params())          # not RapidGPT's AdamW/SGD
    args = SimpleNamespace(precision=PrecisionConfig(params_dtype="float16"), clip_grad=1.0)
    with pytest.raises(OptimizerRebuildError, match="--fp16: the SimpleNamespace from model_optimizer_lr_scheduler_"
                                                    "provider cannot be rebuilt over fp32 main parameters"):
        wrap_optimizer(foreign, net, args)
    args.zero = ZeroConfig(2, "--zero-2-memory-optimization")
    with pytest.raises(OptimizerRebuildError, match="--zero-2-memory-optimization: the SimpleNamespace from "
                                                    "model_optimizer_lr_scheduler_provider cannot be rebuilt over "
                                                    "this rank's shard of the parameters"):
        wrap_optimizer(foreign, net, args)


def test_query_key_layer_scaling_keeps_fp16_scores_finite_as_megatron():
    """--apply-query-key-layer-scaling in layer 8 of an fp16 model: q k^T / sqrt(hn) exceeds fp16
    (65504) where q k^T / (8 sqrt(hn)) does not, so the plain fp16 attention is not finite while
    the scaled one (multiplied back by 8 in fp32, masked, softmax in fp32, as Megatron's
    FusedScaleMaskSoftmax) gives the float64 attention within fp16 rounding."""
    from rapidgpt.config.transformer import TransformerConfig
    from rapidgpt.models.attention import CoreAttention

    rng = np.random.default_rng(3)
    b, heads, s, hn = 1, 2, 4, 16
    q = rng.uniform(60, 70, (b, heads, s, hn))        # q.k ~ 16 * 65^2 = 67600 > 65504 (fp16's largest)
    k = rng.uniform(60, 70, (b, heads, s, hn)) * np.array([1, -1, 1, -1])[:, None]     # keys of both signs
    v = rng.standard_normal((b, heads, s, hn))
    mask = np.triu(np.ones((1, 1, s, s), bool), 1)
    scores = np.einsum("bnqd,bnkd->bnqk", q, k) / math.sqrt(hn)
    scores = np.where(mask, -10000.0, scores)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("bnqk,bnkd->bqnd", probs / probs.sum(-1, keepdims=True), v).reshape(b, s, heads * hn)

    def attention(*flags):
        args = parse_args(argv=["--task", "pretraining", "--num-layers", "8", "--hidden-size", "32",
                                "--num-attention-heads", "2", "--attention-dropout", "0", "--train-iters", "1",
                                "--fp16", *flags])
        core = CoreAttention(TransformerConfig.from_args(args), hn, layer_number=8)
        core.set_train(False)
        return core(*(Tensor(x, ms.float16) for x in (q, k, v)), Tensor(mask)).asnumpy().astype(np.float64)

    assert not np.isfinite(attention()).all()
    scaled = attention("--apply-query-key-layer-scaling")
    np.testing.assert_allclose(scaled, expected, rtol=0, atol=2e-2)
