"""Pipeline parallelism: the 1F1B order (simulated for every stage, no processes); the autograd
mechanism the executor relies on (held backwards run oldest first, no forward recomputed); then the
tiny 4-layer GPT trained with PP=2, PP=4, PP=2 x DP=2 and PP=2 x TP=2 under msrun against one
process (dropout on: losses, grad norms, validation losses and final weights), with one micro-batch
per step (m = 1 < P), in fp16, with recompute; checkpoints moving between PP=2 x TP=2 and one
process, and between pipeline sizes offline."""
import json
import os
import re
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

from batched_runs import BatchedRuns, declared_runs, tensorboard_of
from rapidgpt.config.precision import PrecisionConfig
from rapidgpt.config.recompute import RecomputeConfig
from rapidgpt.parallel.pipeline import forward_only, one_f_one_b, stage_layer_range
from rapidgpt.theoretical_memory import GPTShape, stage_parameters, total_parameters
from rapidgpt.tokenizer import padded_vocab_size
from rapidgpt.training.checkpointing import gathered_tensors
from rapidgpt.training.model_transforms import ModelTransformError, prepare_model
from rapidgpt.mindspore_private import autograd_recording
from rapidgpt.training.pipeline_schedules import StageForward, _backward
from test_parallel import (FP16, SCALES, STATISTICS, TINY,
                           assert_close_run, assert_layout, assert_same_pieces, assert_same_run,
                           assert_same_statistics, assert_same_weights, checkpoint_of, convert_checkpoint, msrun,
                           single, skipped, values)

UP = {"recv_forward": "F", "send_backward": "B", "send_backward_recv_forward": "FB"}
DOWN = {"send_forward": "F", "recv_backward": "B", "send_forward_recv_backward": "FB"}


def link_calls(actions, kinds):
    return [kinds[kind] for kind, _ in actions if kind in kinds]


@pytest.mark.parametrize("pp_size", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7])
def test_one_f_one_b_order(pp_size, m):
    plans = [one_f_one_b(pp_size, stage, m) for stage in range(pp_size)]
    for stage, actions in enumerate(plans):
        forwards = [i for kind, i in actions if kind == "forward"]
        backwards = [i for kind, i in actions if kind == "backward"]
        assert forwards == list(range(m)) and backwards == list(range(m))      # each once, in order
        held, most = set(), 0
        for kind, i in actions:
            if kind == "forward":
                held.add(i)
                most = max(most, len(held))
            elif kind == "backward":
                assert i in held                    # a backward follows its own forward
                held.remove(i)
        assert most == min(pp_size - stage, m)      # Megatron's bound, reached
        warmup = next(k for k, (kind, _) in enumerate([a for a in actions if a[0] in ("forward", "backward")])
                      if kind == "backward")
        assert warmup == min(pp_size - stage - 1, m) + (1 if m > pp_size - stage - 1 else 0)
        if stage == 0:
            assert not link_calls(actions, UP)
        if stage == pp_size - 1:
            assert not link_calls(actions, DOWN)
    for stage in range(pp_size - 1):
        # Neighbours make the same exchanges in the same order on their shared link: no deadlock.
        assert link_calls(plans[stage], DOWN) == link_calls(plans[stage + 1], UP)


def test_forward_only_order():
    assert forward_only(3, 1, 2) == [("recv_forward", 0), ("forward", 0), ("send_forward", 0),
                                     ("recv_forward", 1), ("forward", 1), ("send_forward", 1)]
    assert forward_only(2, 0, 1) == [("forward", 0), ("send_forward", 0)]


def test_stage_layer_range():
    assert list(stage_layer_range(8, 4, 2)) == [4, 5]
    assert list(stage_layer_range(4, 1, 0)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="--num-layers 6 is not divisible by --pipeline-model-parallel-size 4"):
        stage_layer_range(6, 4, 0)


# Every pipeline run logs Megatron's statistics: the layouts check them (assert_same_statistics).
FOUR_LAYERS = [("4" if a == "2" and TINY[k - 1] == "--num-layers" else a) for k, a in enumerate(TINY)] + [*STATISTICS]
PP2 = ("--pipeline-model-parallel-size", "2")
PP2_TP2 = (*PP2, "--tensor-model-parallel-size", "2")


ONE_MICRO_BATCH = ("--global-batch-size", "2")
PIPELINE_RUNS = [(1,), (2, *PP2), (4, "--pipeline-model-parallel-size", "4"), (4, *PP2), (4, *PP2_TP2),
                 (1, *ONE_MICRO_BATCH), (2, *PP2, *ONE_MICRO_BATCH), (1, *FP16), (2, *PP2, *FP16),
                 (2, *PP2, "--recompute-activations"), (2, *PP2, "--checkpoint-activations")]


@pytest.fixture(scope="module")
def pipeline_runs(env, tmp_path_factory, request):
    """`pipeline_runs(nproc, *flags)`: the 4-layer tiny run, saving every 6 iterations, once per
    module, the PIPELINE_RUNS of one size in one job (tests/batched_runs.py) -> (its printed
    values with TensorBoard's grad norms, its --save folder, its log)."""
    def argv(nproc, *flags):
        return nproc, FOUR_LAYERS + ["--save-interval", "6", *flags]
    batched = BatchedRuns(env, tmp_path_factory.mktemp("pipeline_runs"),
                          [argv(*key) for key in declared_runs(request, "PIPELINE_RUNS")])

    def run(nproc, *flags):
        status, log, save = batched(*argv(nproc, *flags))
        assert status == 0, log[-3000:]
        found = values(log, tensorboard_of(save))
        assert len(found) == 2 * (12 - len(skipped(log))) + 3, log[-2000:]   # (loss, norm) per update, 3 validations
        return found, save, log
    return run


@pytest.mark.parametrize("nproc, layout", [(2, PP2), (4, ("--pipeline-model-parallel-size", "4")), (4, PP2),
                                           (4, PP2_TP2)], ids=["pp2", "pp4", "pp2xdp2", "pp2xtp2"])
def test_pipeline_reproduces_one_process(pipeline_runs, nproc, layout):
    found, save, _ = pipeline_runs(nproc, *layout)
    reference, single_save, _ = pipeline_runs(1)
    flags = dict(zip(layout[::2], layout[1::2]))
    assert_layout(save, tp=int(flags.get("--tensor-model-parallel-size", 1)), world_size=nproc,
                  pp=int(flags["--pipeline-model-parallel-size"]))
    assert len(reference) == 2 * 12 + 3
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)
    assert_same_statistics(save, single_save, int(flags.get("--tensor-model-parallel-size", 1)), vocab_size,
                           num_layers=int(FOUR_LAYERS[FOUR_LAYERS.index("--num-layers") + 1]))


def test_rank_0_prints_its_parameters_and_the_memory_estimate(pipeline_runs):
    """Megatron's parameter line of stage 0 at TP=2 is what the memory estimator counts for it."""
    _, save, log = pipeline_runs(4, *PP2_TP2)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    def flag(name):
        return int(FOUR_LAYERS[FOUR_LAYERS.index(name) + 1])
    h, s = flag("--hidden-size"), flag("--seq-length")
    shape = GPTShape(flag("--num-layers"), h, flag("--num-attention-heads"), 4 * h, s, s,
                     padded_vocab_size(vocab_size, flag("--make-vocab-size-divisible-by"), 2))
    count = int(re.search(r"model parallel rank \(0, 0\): (\d+)", log).group(1))
    assert count == stage_parameters(shape, 0, 2, 2)
    assert re.search(r" > theoretical memory per rank of the most loaded pipeline stage \(stage \d of 2, TP=2, DP=1, "
                     r"ZeRO stage 0\): weights .* "
                     rf"parameters {total_parameters(shape):,} ", log), log[:3000]


def test_stages_compile_their_optimizer_step_before_the_ranks_meet(pipeline_runs):
    """Its norm and overflow check are collectives over the stages: every rank compiles it first
    (the stages' layers compile at the warm-up, before their first exchange)."""
    log = pipeline_runs(4, *PP2_TP2)[2]
    assert re.search(r" > optimizer step compiled on every rank \(this rank waited [\d.]+ s for the others\)\n"
                     r"(?:.*\n)* iteration +1/", log), log[-3000:]
    assert " > compile cache: off for pipeline-parallel steps" in log, log[:3000]


def test_one_micro_batch_fewer_than_stages(pipeline_runs):
    assert_same_run(pipeline_runs(2, *PP2, *ONE_MICRO_BATCH)[0], pipeline_runs(1, *ONE_MICRO_BATCH)[0])


def test_fp16_pipeline_follows_the_single_process_fp16_run(pipeline_runs):
    """Losses, the updated iterations' grad norms and validation losses within 5e-3; the same
    iterations skipped at the same loss scales."""
    found, save, log = pipeline_runs(2, *PP2, *FP16)
    reference, _, reference_log = pipeline_runs(1, *FP16)
    assert_layout(save, tp=1, world_size=2, pp=2)
    assert 0 < len(skipped(reference_log)) < 12 and skipped(log) == skipped(reference_log)
    assert SCALES.findall(log) == SCALES.findall(reference_log)
    assert_close_run(found, reference, 5e-3)


@pytest.mark.parametrize("recompute", ["--recompute-activations", "--checkpoint-activations"],
                         ids=["selective", "full"])
def test_recompute_in_a_pipeline_prints_exactly_the_run_without_it(pipeline_runs, recompute):
    found, _, log = pipeline_runs(2, *PP2, recompute)
    reference, _, reference_log = pipeline_runs(2, *PP2)
    assert "activation recompute" in log and "(2 cells marked)" in log     # rank 0's 2 layers (or their cores)
    assert "activation recompute" not in reference_log
    assert found == reference


def test_pipeline_checkpoint_resumes_and_evaluates_in_one_process(pipeline_runs, env, tmp_path):
    found, save, _ = pipeline_runs(4, *PP2_TP2)
    reference, _, _ = pipeline_runs(1)
    status, log = single(FOUR_LAYERS + ["--load", checkpoint_of(save, 6, tmp_path / "six"),
                                        "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert "saved at tensor-parallel size 2, resharded to 1, pipeline size 2 read as 1" in log
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])    # iterations 7..12, the last 2 validations
    status, log = single(FOUR_LAYERS + ["--load", str(save), "--skip-train"], env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log), found[-1:])           # the PP=2 x TP=2 run's final validation loss
    status, log = single(["--task", "text_generation", "--load", str(save), "--prompt", "The assert statement",
                          "--max-new-tokens", "4"], env)
    assert status == 0 and "continuation:" in log, log[-3000:]


def test_convert_checkpoint_changes_the_pipeline_size(pipeline_runs, env, tmp_path):
    found, save, _ = pipeline_runs(2, *PP2)
    assert "pipeline size 2 -> 1" in convert_checkpoint(env, save, tmp_path / "pp1", "--target-pipeline-parallel-size", "1")
    assert "mp_rank_00" in os.listdir(tmp_path / "pp1" / "iter_0000012")
    status, log = single(FOUR_LAYERS + ["--load", str(tmp_path / "pp1"), "--skip-train"], env)
    assert status == 0 and "resharded" not in log, log[-3000:]
    assert_same_run(values(log), found[-1:])
    convert_checkpoint(env, tmp_path / "pp1", tmp_path / "pp2", "--target-pipeline-parallel-size", "2")
    assert_same_pieces(save, tmp_path / "pp2", ("mp_rank_00_000", "mp_rank_00_001"))   # PP 2 -> 1 -> 2


def test_single_process_checkpoint_resumes_in_a_pipeline(pipeline_runs, env, tmp_path):
    _, save, _ = pipeline_runs(1)
    reference, _, _ = pipeline_runs(1)
    status, log = msrun(4, ["rapidgpt/cli.py"] + FOUR_LAYERS + ["--load", checkpoint_of(save, 6, tmp_path / "load"),
                                                                *PP2_TP2, "--tensorboard-dir", str(tmp_path / "tb")],
                        tmp_path / "logs", env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])


def test_pipeline_flags_are_checked(env):
    status, log = single(FOUR_LAYERS + ["--pipeline-model-parallel-size", "3", "--nproc-per-node", "3"], env)
    assert status != 0 and "--num-layers 4 cannot be split into 3 equal stages" in log, log[-2000:]
    status, log = single(FOUR_LAYERS + ["--num-layers-per-virtual-pipeline-stage", "1"], env)
    assert status != 0 and "--num-layers-per-virtual-pipeline-stage: not in this build" in log, log[-2000:]


class _CountingLayer(nn.Cell):
    """tanh(x W): counts how often its compiled forward runs (a graph-side counter)."""

    def __init__(self, seed, counter):
        super().__init__()
        self.weight = Parameter(Tensor(np.random.default_rng(seed).standard_normal((8, 8)).astype(np.float32) * 0.4))
        self.counter = counter

    def construct(self, x):
        ops.assign_add(self.counter, Tensor(1, ms.int32))
        return ops.tanh(ops.matmul(x, self.weight))


class _Stage(nn.Cell):
    def __init__(self, counter):
        super().__init__()
        self.layers = nn.CellList([_CountingLayer(seed, counter) for seed in range(3)])
        self.input_tensor = None

    def set_input_tensor(self, tensor):
        self.input_tensor = tensor

    def construct(self, scale):
        x = self.input_tensor
        for layer in self.layers:
            x = layer(x)
        return x * scale


def test_held_backwards_run_oldest_first_without_recomputing():
    """The mechanism the 1F1B executor relies on: forwards recorded with compiled layers, then their
    backwards run oldest first (FIFO), each giving its own micro-batch's gradients, and no layer's
    forward runs again in a backward."""
    counter = Parameter(Tensor(0, ms.int32), name="forward_count", requires_grad=False)
    stage = _Stage(counter)
    prepare_model(stage, PrecisionConfig(), RecomputeConfig(), compile_layers=True)
    params = tuple(stage.trainable_params())
    rng = np.random.default_rng(7)
    micro_batches = [(rng.standard_normal((2, 8)).astype(np.float32), float(k + 1)) for k in range(3)]
    held = []
    for x, scale in micro_batches:                 # all forwards first: three pending backwards
        inputs = Tensor(x)
        inputs.requires_grad_()
        with autograd_recording():
            output = StageForward(lambda s: stage(Tensor(np.float32(s))), stage, last=False)(scale, inputs)
        held.append((x, scale, inputs, output))
    assert int(counter.asnumpy()) == 3 * 3
    for x, scale, inputs, output in held:          # oldest first, as 1F1B does
        seed = Tensor(np.ones((2, 8), np.float32))
        grads = _backward(output, seed, params + (inputs,))
        stage.set_input_tensor(Tensor(x))
        expected = ms.grad(lambda s: (stage(s) * seed).sum(), grad_position=None, weights=params)(Tensor(np.float32(scale)))
        for ours, reference in zip(grads[:-1], expected):
            np.testing.assert_allclose(ours.asnumpy(), reference.asnumpy(), rtol=1e-5, atol=1e-6)
        assert grads[-1].shape == (2, 8)
    assert int(counter.asnumpy()) == 3 * 3 + 3 * 3     # only the 3 reference gradients ran forwards again


def test_full_recompute_in_a_stage_needs_the_layers_in_one_cell():
    """Recompute works inside a graph only: a stage whose layers are compiled one by one (a plain
    CellList) cannot recompute whole layers, and says what to change."""
    stage = _Stage(Parameter(Tensor(0, ms.int32), name="forward_count", requires_grad=False))
    with pytest.raises(ModelTransformError, match="keep them in a rapidgpt.models.transformer.TransformerLayers"):
        prepare_model(stage, PrecisionConfig(), RecomputeConfig("full", "uniform", 1), compile_layers=True)
