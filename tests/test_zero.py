"""ZeRO stages 1-3 under msrun against one process: the tiny GPT with its optimizer state (stage 1),
gradients (stage 2, rapidgpt/optim/distributed_optimizer.py) and parameters (stage 3,
rapidgpt/parallel/fully_sharded.py) sharded over DP=2, stage 2 over TP=2 x DP=2 and stage 3
over PP=2 x DP=2 with full recompute, prints the single-process losses, grad norms
and validation losses within 1e-5 and ends with the same weights and optimizer state (gathered
whole in its checkpoint); fp16 follows the fp16 run (stage 3 at TP=2 x DP=2), and so does
Rapidformer's whole switch set on 8 ranks (TP=2 x PP=2 x DP=2, ZeRO-2, full recompute,
--mixed-precision); a checkpoint goes ZeRO-2 at DP=2 -> one process -> ZeRO-3 at DP=2 (and ZeRO-1)
exactly; each rank holds the bytes the memory estimate says. The sharding plan and the
wrappers are checked without processes."""
import json
import math
import re
from pathlib import Path

import pytest

from batched_runs import BatchedRuns, tensorboard_of
from rapidgpt.parallel.data_parallel import ShardPlan
from rapidgpt.theoretical_memory import GPTShape, RunLayout, estimate
from rapidgpt.tokenizer import padded_vocab_size
from rapidgpt.training.checkpointing import gathered_tensors
from test_parallel import (FP16, SCALES, STATISTICS, TINY,
                           assert_close_run, assert_layout, assert_same_run, assert_same_statistics,
                           assert_same_weights, checkpoint_of, convert_checkpoint, single, skipped, values)

ZERO1 = ("--zero-1-memory-optimization",)
ZERO2 = ("--zero-2-memory-optimization",)
ZERO3 = ("--zero-3-memory-optimization",)
ZERO = {0: (), 1: ZERO1, 2: ZERO2, 3: ZERO3}
# Megatron-FSDP's flags as its functional test gives them (its default strategy shards parameters,
# gradients and optimizer state: ZeRO-3; its default gradient dtype is the model's).
MEGATRON_FSDP = ("--use-megatron-fsdp", "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor")
PP2 = ("--pipeline-model-parallel-size", "2")
FULL_RECOMPUTE = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")
RAPIDFORMER = (*PP2, *ZERO2, "--checkpoint-activations", "--mixed-precision", *FP16[1:],   # with TP=2, 8 ranks
               *STATISTICS)     # the full-recompute step with Megatron's statistics (they once broke it at TP=2)
# ZeRO-1 runs without weight decay: then nothing but the update kernels writes the pieces before they
# are gathered (see test_zero_gathers_the_updated_pieces_without_weight_decay).
NO_DECAY = ("--weight-decay", "0")
SGD = ("--optimizer", "sgd")
# Each stage's run at DP=2, and the single-process run it reproduces (the layout's other flags added).
DP2_STAGE = {1: (*ZERO1, *NO_DECAY), 2: ZERO2, 3: ZERO3}
REFERENCE = {1: NO_DECAY, 2: (), 3: ()}
# The runs of the `runs` fixture (tests/conftest.py) this module's tests ask for.
TINY_RUNS = [(1, 1, *STATISTICS), (1, 1, *NO_DECAY, *STATISTICS), (1, 1, *FP16), (1, 1, *FP16, "--accumulate-allreduce-grads-in-fp32"),
             *[(2, 1, *DP2_STAGE[stage], *STATISTICS) for stage in (1, 2, 3)],
             (4, 2, *ZERO2, *STATISTICS), (4, 1, *PP2, *FULL_RECOMPUTE, *ZERO3, *STATISTICS),
             (2, 1, *FP16, "--accumulate-allreduce-grads-in-fp32", *ZERO2), (4, 2, *FP16, *MEGATRON_FSDP), (8, 2, *RAPIDFORMER),
             (2, 2, "--sequence-parallel", *STATISTICS), (2, 1, *ZERO1, *NO_DECAY, *SGD), (1, 1, *NO_DECAY, *SGD)]
HELD = re.compile(r"model states held on this rank: weights (\d+) bytes, main parameters and optimizer state "
                  r"(\d+) bytes")
HANDED = re.compile(r"gradients handed to the optimizer on this rank: (\d+) bytes")


def test_shard_plan_cuts_the_flat_parameters_into_equal_ranges():
    shapes = [(3, 4), (5,), (2, 2, 2)]                  # 12 + 5 + 8 = 25 elements, S = 7 at N = 4
    plans = [ShardPlan(shapes, 4, rank) for rank in range(4)]
    assert [plan.shard for plan in plans] == [7] * 4
    assert plans[0].pieces == ((0, 0, 7),)
    assert plans[1].pieces == ((0, 7, 12), (1, 0, 2))
    assert plans[2].pieces == ((1, 2, 5), (2, 0, 4))
    assert plans[3].pieces == ((2, 4, 8),) and plans[3].padding == 3
    owned = sorted((plan.offsets[i] + lo, plan.offsets[i] + hi) for plan in plans for i, lo, hi in plan.pieces)
    assert owned[0][0] == 0 and owned[-1][1] == 25
    assert all(a[1] == b[0] for a, b in zip(owned, owned[1:]))      # every element owned exactly once


def test_zero_3_gives_every_rank_even_pieces_of_every_parameter():
    """EvenShardPlan: each parameter cut into N ranges of ceil(n / N) elements, so every rank holds
    pieces of the same number and lengths (the same graph on every rank); `split` of all ranks'
    pieces end to end gives back the parameters."""
    import mindspore as ms
    import numpy as np
    from rapidgpt.parallel.fully_sharded import EvenShardPlan
    shapes = [(3, 4), (5,), (2,)]                        # 12, 5 and 2 elements at N = 4: widths 3, 2, 1
    plans = [EvenShardPlan(shapes, 4, rank) for rank in range(4)]
    assert {plan.widths for plan in plans} == {(3, 2, 1)} and all(plan.padding == 0 for plan in plans)
    assert plans[0].pieces == ((0, 0, 3), (1, 0, 2), (2, 0, 1))
    assert plans[2].pieces == ((0, 6, 9), (1, 4, 5), (2, 2, 2))        # a piece of zeros only: (2, 2, 2)
    assert plans[3].pieces == ((0, 9, 12), (1, 5, 5), (2, 2, 2))
    whole = [np.arange(12.0).reshape(3, 4), np.arange(100.0, 105.0), np.array([7.0, 8.0])]
    flat = []
    for plan in plans:
        for (i, lo, hi), width in zip(plan.pieces, plan.widths):
            flat.extend(list(whole[i].reshape(-1)[lo:hi]) + [0.0] * (width - (hi - lo)))
    split = plans[1].split(ms.Tensor(np.array(flat, np.float32)))
    for found, expected in zip(split, whole):
        np.testing.assert_array_equal(found.asnumpy(), expected)


# Stage 2 at DP=2 and TP=2 x DP=2; stage 3 at DP=2, at PP=2 x DP=2 below and at TP=2 x DP=2 in fp16
# (test_fp16_zero_follows_the_single_process_fp16_run; a BERT's in tests/test_bert.py).
@pytest.mark.parametrize("nproc, tp, layout, stage", [(2, 1, (), 1), (2, 1, (), 2), (4, 2, (), 2), (2, 1, (), 3),
                                                     (4, 1, PP2 + FULL_RECOMPUTE, 3)],
                         ids=["zero1-dp2-no-decay", "zero2-dp2", "zero2-tp2xdp2", "zero3-dp2", "zero3-pp2xdp2-recompute"])
def test_zero_reproduces_the_single_process_run(runs, nproc, tp, layout, stage):
    """Losses, grad norms, validation losses, Megatron's statistics and the end weights. Stage 1
    without weight decay: at commit c3aa45a Adam gathered the previous step's pieces there (its
    iteration 3 loss 8.299450 against 8.301030; see AdamW/SGD.assign_before_update)."""
    flags = DP2_STAGE[stage] if nproc == 2 else ZERO[stage]
    found, save, log = runs(nproc, tp, *layout, *flags, *STATISTICS)
    reference, single_save, _ = runs(1, 1, *(REFERENCE[stage] if nproc == 2 else ()), *STATISTICS)
    assert f"ZeRO stage {stage}" in log
    assert_layout(save, tp=tp, world_size=nproc, pp=2 if layout else 1)
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)
    assert_same_statistics(save, single_save, tp, vocab_size)


def test_zero_gathers_the_updated_pieces_without_weight_decay(runs):
    """SGD with momentum, no parameter decayed (Adam's case: zero1-dp2-no-decay above)."""
    found, _, _ = runs(2, 1, *ZERO1, *NO_DECAY, *SGD)
    reference, _, _ = runs(1, 1, *NO_DECAY, *SGD)
    assert_same_run(found, reference)


def assert_follows_the_fp16_run(found, log, reference, reference_log, overflows=True):
    """The same skipped iterations (some, when `overflows`) and loss scales as the single-process fp16
    run; the losses, the updated iterations' grad norms (TensorBoard's) and the validation losses
    within 5e-3."""
    assert (0 < len(skipped(reference_log)) < 12) if overflows else not skipped(reference_log)
    assert skipped(log) == skipped(reference_log)
    assert SCALES.findall(log) == SCALES.findall(reference_log)
    assert_close_run(found, reference, 5e-3)


@pytest.mark.parametrize("nproc, tp, zero, accumulation", [(2, 1, ZERO2, ("--accumulate-allreduce-grads-in-fp32",)),
                                                         (4, 2, MEGATRON_FSDP, ())],
                         ids=["zero2-fp32-grads", "megatron-fsdp-zero3-tp2xdp2"])
def test_fp16_zero_follows_the_single_process_fp16_run(runs, nproc, tp, zero, accumulation):
    """ZeRO-2 reduce-scattering fp32-accumulated gradients (none overflow in these 12 iterations);
    ZeRO-3 at TP=2 x DP=2, asked for with Megatron-FSDP's flags, gathering fp16 weights and
    reduce-scattering fp16 gradients in each micro-batch's backward (some overflow). (ZeRO-1 and
    ZeRO-2 with fp16 gradients and overflows: Rapidformer's set below, whose ZeRO-2 at PP=2 also
    covers the pipeline's ZeRO-2 order.)"""
    found, save, log = runs(nproc, tp, *FP16, *accumulation, *zero)
    assert_layout(save, tp=tp, world_size=nproc)
    assert f"ZeRO stage {3 if zero == MEGATRON_FSDP else 2}" in log
    assert zero != MEGATRON_FSDP or (" > --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params: "
                                     "ZeRO stage 3, gradients summed and reduced in fp16") in log
    assert_follows_the_fp16_run(found, log, *runs(1, 1, *FP16, *accumulation)[::2], overflows=not accumulation)


def test_rapidformers_switch_set_on_8_ranks_follows_the_single_process_fp16_run(runs):
    """--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --zero-2-memory-optimization
    --checkpoint-activations --mixed-precision (as launch/rapidformer_switches.sh runs it)."""
    found, save, log = runs(8, 2, *RAPIDFORMER)
    assert "ZeRO stage 2" in log and "TP=2, DP=2" in log
    assert_layout(save, tp=2, world_size=8, pp=2)
    assert_follows_the_fp16_run(found, log, *runs(1, 1, *FP16)[::2])


def test_a_checkpoint_resumes_across_zero_stages_and_data_parallel_sizes(runs, env, tmp_path):
    """ZeRO-2 at DP=2 -> one process without ZeRO -> ZeRO-3 at DP=2, and -> ZeRO-1 at DP=2: each
    leg prints what the uninterrupted single-process run prints (optimizer state included)."""
    _, save, _ = runs(2, 1, *ZERO2, *STATISTICS)
    reference, _, _ = runs(1, 1, *STATISTICS)
    middle = tmp_path / "single"
    status, log = single(TINY + ["--load", checkpoint_of(save, 6, tmp_path / "zero2"), "--save", str(middle),
                                 "--exit-interval", "9", "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log, tmp_path / "tb"), reference[13:19])      # iterations 7..9
    legs = [(2, TINY + ["--load", str(middle), *zero]) for zero in (ZERO3, ZERO1)]
    batched = BatchedRuns(env, tmp_path / "legs", legs)       # both in one job
    for leg in legs:
        status, log, leg_save = batched(*leg)
        assert status == 0, log[-3000:]
        assert_same_run(values(log, tensorboard_of(leg_save)), reference[19:])    # iterations 10..12, 2 validations


@pytest.mark.parametrize("flags", [ZERO2 + STATISTICS, FP16 + MEGATRON_FSDP], ids=["zero2", "zero3-fp16"])
def test_a_zero_checkpoint_converts_offline_as_any_other(runs, env, tmp_path, flags):
    """A ZeRO checkpoint holds whole tensors (the optimizer state too) and the metadata of an
    unsharded run (every parameter's name, its tensor-parallel split: those of the TP=2 run
    without ZeRO), so the offline converter takes the TP=2 x DP=2 ZeRO-2 and ZeRO-3 runs' to TP=1
    and back without knowing about ZeRO."""
    import numpy as np
    _, save, _ = runs(4, 2, *flags)
    _, reference, _ = runs(2, 2, "--sequence-parallel", *STATISTICS)
    for rank_dir in ("mp_rank_00", "mp_rank_01"):
        ours, theirs = (json.loads(Path(folder, "iter_0000012", rank_dir, "state.json").read_text())
                        for folder in (save, reference))
        assert sorted(ours["model_parameters"]) == sorted(theirs["model_parameters"])
        assert ours["tensor_parallel_layout"] == theirs["tensor_parallel_layout"]
    convert_checkpoint(env, save, tmp_path / "tp1", "--target-tensor-parallel-size", "1")
    convert_checkpoint(env, tmp_path / "tp1", tmp_path / "tp2", "--target-tensor-parallel-size", "2")
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    original = gathered_tensors(save)
    assert any(name.startswith("adam_m.") for name in original)
    for converted in (gathered_tensors(tmp_path / "tp1"), gathered_tensors(tmp_path / "tp2")):
        assert sorted(converted) == sorted(original)
        for name, value in original.items():          # the vocabulary padding depends on the TP size
            ours = converted[name]
            if ours.shape != value.shape:
                ours, value = ours[:vocab_size], value[:vocab_size]
            np.testing.assert_array_equal(ours, value, err_msg=name)


@pytest.mark.parametrize("nproc, stage", [(1, 0), (2, 1), (2, 2), (2, 3)])
def test_each_rank_holds_what_the_memory_estimate_says(runs, nproc, stage):
    """Rank 0's weights, the gradients its optimizer is handed and its fp32 main parameters + Adam
    moments, measured from the tensors it holds, against the estimate (the optimizer's unsharded
    scalars: step count, learning rate) and the ZeRO paper's terms (fp32: 4 + 4 + 12 bytes, at
    stage 3 4 + 4 + 8: the fp32 pieces are the main parameters). Stage 3 cuts each parameter on its
    own: rank 0 holds ceil(size / N) elements of each, at most one per parameter more than ceil(Psi / N)."""
    _, save, log = runs(nproc, 1, *(DP2_STAGE[stage] if stage else ()), *STATISTICS)
    weights, state = map(int, HELD.search(log).groups())
    gradients = int(HANDED.search(log).group(1))
    def flag(name):
        return int(TINY[TINY.index(name) + 1])
    h, s, layers = flag("--hidden-size"), flag("--seq-length"), flag("--num-layers")
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    padded = padded_vocab_size(vocab_size, flag("--make-vocab-size-divisible-by"))
    shape = GPTShape(layers, h, flag("--num-attention-heads"), 4 * h, s, s, padded)
    expected = estimate(shape, RunLayout(data_parallel=nproc, zero_stage=stage,
                                         optimizer_bytes=12 if stage in (1, 2) else 8))
    psi, shard = expected.parameters, math.ceil(expected.parameters / nproc)      # rank 0's shard: no padding
    scalars = 4 + 4                                      # adam_step (int32), learning_rate (fp32)
    if stage == 3:
        layer = [h, h, 3 * h * h, 3 * h, h * h, h, h, h, 4 * h * h, 4 * h, 4 * h * h, h]     # LN, QKV, proj, LN, MLP
        params = layer * layers + [padded * h, s * h, h, h]                  # embeddings, final LayerNorm
        held = sum(math.ceil(n / nproc) for n in params)
        assert sum(params) == psi and 0 <= held - shard < len(params)
        assert (weights, gradients, state - scalars) == (4 * held, 4 * held, 8 * held)
        return
    assert weights == expected.weight_bytes_per_rank
    assert gradients == expected.gradient_bytes_per_rank
    assert state - scalars == expected.optimizer_bytes_per_rank
    assert weights == 4 * psi
    assert gradients == 4 * (shard if stage >= 2 else psi)
    assert state - scalars == (12 * shard if stage >= 1 else 8 * psi)


@pytest.mark.parametrize("shard_gradients", [False, True], ids=["zero1", "zero2"])
def test_zero_steps_a_users_model_as_the_unsharded_wrapper(shard_gradients):
    """In one process (one shard): a user's nn.Cell with its own AdamW (weight decay on the
    matrices only), fp16, clipped: the same weights, main parameters and Adam state after three
    steps (assert_steps_alike). At stage 2 the wrapper is handed the gradients as the schedule's
    reduce-scatter hands them: this rank's pieces, flat."""
    import mindspore as ms
    from mindspore import nn

    from rapidgpt.config.precision import PrecisionConfig
    from rapidgpt.optim import AdamW, OptimizerWrapper
    from rapidgpt.optim.distributed_optimizer import DistributedOptimizerWrapper
    from rapidgpt.optim.mixed_precision import _piece_optimizer

    precision = PrecisionConfig(params_dtype="float16", loss_scale=1.0)
    wrappers = []
    for sharded in (False, True):
        ms.set_seed(0)
        model = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2))
        for param in model.get_parameters():
            param.set_dtype(ms.float16)
        inner = AdamW(model.trainable_params(), lr=1e-2, weight_decay=0.1)
        wrappers.append(DistributedOptimizerWrapper(inner.parameters, _piece_optimizer(inner, None), precision, 1.0,
                                                    shard_gradients) if sharded
                        else OptimizerWrapper.around(inner, 1.0, precision))
    assert wrappers[1].gradient_layout is (wrappers[1].plan if shard_gradients else None)
    assert_steps_alike(*wrappers, flat_grads=shard_gradients)


def test_zero_3_steps_a_users_model_of_rapidgpt_layers_as_the_unsharded_wrapper():
    """In one process (one shard per layer): a user's cell of RapidGPT layers (a linear with bias,
    a LayerNorm, a linear without) and a layer of its own built on ShardableLayer, with its own AdamW (weight decay on the matrices only), fp16,
    clipped. Sharded by the ZeRO-3 transform, it computes the same output; wrap_optimizer rebuilds
    the AdamW over the pieces (each decayed as its parameter), and after three steps that wrapper
    holds the unsharded wrapper's weights, main parameters and Adam state (assert_steps_alike)."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from types import SimpleNamespace

    from rapidgpt.config.precision import PrecisionConfig
    from rapidgpt.config.zero import ZeroConfig
    from rapidgpt.models.norms import LayerNorm
    from rapidgpt.optim import AdamW, OptimizerWrapper
    from rapidgpt.optim.mixed_precision import wrap_optimizer
    from rapidgpt.optim.distributed_optimizer import FullyShardedOptimizerWrapper
    from rapidgpt.parallel.data_parallel import REDUCED_IN_BACKWARD
    from rapidgpt.parallel.fully_sharded import ShardableLayer, shard_model_parameters
    from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear

    class Scale(ShardableLayer, nn.Cell):        # a user's own layer: all ZeRO-3 needs is weight_names
        def __init__(self):
            super().__init__()
            self.scale = ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="scale")
            self.weight_names = ("scale",)

        def construct(self, x):
            return x * self.whole_weights()[0]

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.up = ColumnParallelLinear(4, 8)
            self.norm = LayerNorm((8,))
            self.down = RowParallelLinear(8, 2, bias=False)
            self.scale = Scale()

        def construct(self, x):
            return self.scale(self.down(self.norm(self.up(x))))

    precision = PrecisionConfig(params_dtype="float16", loss_scale=1.0)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((3, 4)), ms.float16)
    wrappers, outputs = [], []
    for sharded in (False, True):
        model = Net()
        for param in model.get_parameters():
            param.set_data(ms.Tensor(np.random.default_rng(1).standard_normal(param.shape), ms.float32))
            param.set_dtype(ms.float16)
        inner = AdamW(model.trainable_params(), lr=1e-2, weight_decay=0.1)
        if sharded:
            units = [unit for _, unit in shard_model_parameters(model)]
            assert [p.name for p in model.get_parameters()] == ["up.weight", "up.bias", "norm.gamma", "norm.beta",
                                                                "down.weight", "scale.scale"]
            assert all(p.ndim == 1 for p in model.get_parameters())
            args = SimpleNamespace(zero=ZeroConfig(3, "--zero-3-memory-optimization"), precision=precision,
                                   clip_grad=1.0)
            wrappers.append(wrap_optimizer(inner, model, args, units))    # the user's AdamW, rebuilt over the pieces
            assert isinstance(wrappers[-1], FullyShardedOptimizerWrapper) and wrappers[-1].units == tuple(units)
            assert wrappers[-1].gradient_layout is REDUCED_IN_BACKWARD
        else:
            wrappers.append(OptimizerWrapper.around(inner, 1.0, precision))
        outputs.append(model(x).asnumpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert_steps_alike(*wrappers, flat_grads=True)


def assert_steps_alike(plain, sharded, flat_grads):
    """Three steps of random fp16 gradients (the sharded wrapper handed them flat with
    `flat_grads`, as one process's pieces are), then the same checkpoint tensors and model weights
    within 1e-6 relative (1e-8 absolute near zero): flat pieces add their squares into the clipping norm in another order
    than whole matrices (rapidgpt/optim/clip_grads.py), so the clip factor may differ in its last
    bit (everything else in the update is elementwise)."""
    import mindspore as ms
    import numpy as np
    rng = np.random.default_rng(0)
    for wrapper in (plain, sharded):
        wrapper.report(num_zeros_in_grad=True, params_norm=True)
    for _ in range(3):
        grads = [rng.standard_normal(p.shape) for p in plain.parameters]
        for g in grads:
            g[rng.random(g.shape) < 0.3] = 0.0          # --log-num-zeros-in-grad counts these
        grads = tuple(ms.Tensor(g, ms.float16) for g in grads)
        _, _, _, zeros, params_norm, _ = plain(grads, ms.Tensor(1e-2, ms.float32))
        found = sharded(tuple(g.reshape(-1) for g in grads) if flat_grads else grads, ms.Tensor(1e-2, ms.float32))
        assert float(zeros) == float(found[3]) == sum(int((g.asnumpy() == 0).sum()) for g in grads)
        main = np.sqrt(sum((p.asnumpy().astype(np.float64) ** 2).sum() for p in plain.main_params))
        assert float(params_norm) == pytest.approx(main, rel=1e-6)      # the main (fp32) weights after the update
        assert float(found[4]) == pytest.approx(main, rel=1e-6)
    expected, found = plain.checkpoint_tensors(True), sharded.checkpoint_tensors(True)
    assert sorted(expected) == sorted(found)
    for name, tensor in expected.items():
        ours = found[name]
        ours = ours.whole_value() if hasattr(ours, "whole_value") else ours
        np.testing.assert_allclose(ours.asnumpy(), tensor.asnumpy(), rtol=1e-6, atol=1e-8, err_msg=name)
    for a, b in zip(plain.parameters, sharded.parameters):
        np.testing.assert_allclose(a.asnumpy().reshape(b.shape), b.asnumpy(), rtol=1e-6, atol=1e-8, err_msg=a.name)


def test_zero_3_refuses_a_parameter_shared_by_two_layers():
    """Each layer is sharded on its own: a Parameter two RapidGPT layers hold would be sharded once
    and left whole (never updated) in the other, so the transform stops and names it."""
    from mindspore import nn

    from rapidgpt.parallel.fully_sharded import FullyShardedModelError, shard_model_parameters
    from rapidgpt.parallel.layers import ColumnParallelLinear, VocabParallelEmbedding

    class Tied(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = VocabParallelEmbedding(8, 4)
            self.head = ColumnParallelLinear(4, 8, bias=False)
            self.head.weight = self.embedding.weight

    with pytest.raises(FullyShardedModelError, match=r"embedding.weight is a parameter of both embedding and "
                                                     r"head; ZeRO-3 shards each layer's parameters on their own"):
        shard_model_parameters(Tied())


def test_zero_3_refuses_a_model_of_other_cells_naming_its_parameters():
    """A Finetuner's own nn.SequentialCell of nn.Dense (tests/distributed/mlp_finetuner.py's): the
    message the CLI prints (a ModelTransformError is a UserError)."""
    from mindspore import nn

    from rapidgpt.config.precision import PrecisionConfig
    from rapidgpt.config.recompute import RecomputeConfig
    from rapidgpt.config.zero import ZeroConfig
    from rapidgpt.errors import UserError
    from rapidgpt.training.model_transforms import ModelTransformError, prepare_model

    model = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4))
    with pytest.raises(ModelTransformError) as error:
        prepare_model(model, PrecisionConfig(), RecomputeConfig(), zero=ZeroConfig(3, "--zero-3-memory-optimization"))
    assert isinstance(error.value, UserError)
    assert str(error.value).startswith(
        "--zero-3-memory-optimization: the model (SequentialCell) has trainable parameters outside RapidGPT's "
        "layers (0.weight, 0.bias, 2.weight, ...)")
