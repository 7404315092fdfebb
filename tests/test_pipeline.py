"""Pipeline parallelism: the 1F1B and interleaved orders (simulated for every stage, no processes);
the layers of each stage against a port of Megatron's rule; the autograd mechanism the executor
relies on (held backwards run oldest first, no forward recomputed); then the tiny 4-layer GPT
trained with PP=2 and PP=2 x TP=2, and a 10-layer one with the interleaved schedule on
4 stages (uneven; embedding and loss counted), under msrun against one process (dropout on:
losses, grad norms, validation losses and final weights), with one micro-batch
per step (m = 1 < P), with full recompute (PP=2 x DP=2 and fp16 in a pipeline:
tests/test_zero.py); checkpoints moving between PP=2 x TP=2 and one
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
from rapidgpt.config.pipeline_split import PipelineSplit, check_interleaved_micro_batches
from rapidgpt.parallel.pipeline import forward_only, interleaved_one_f_one_b, one_f_one_b
from rapidgpt.theoretical_memory import GPTShape, stage_parameters, total_parameters
from rapidgpt.tokenizer import padded_vocab_size
from rapidgpt.training.checkpointing import gathered_tensors
from rapidgpt.training.model_transforms import ModelTransformError, prepare_model
from rapidgpt.mindspore_private import autograd_recording
from rapidgpt.training.pipeline_schedules import StageForward, _backward
from test_parallel import (STATISTICS, TINY,
                           assert_layout, assert_same_pieces, assert_same_run,
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


def megatron_layers(split, pp_rank, vp_stage):
    """A port of Megatron-core's get_num_layers_to_build and get_transformer_layer_offset (d98e8a6,
    no custom layout) -> the global layer indices (pp_rank, vp_stage) builds."""
    L, P = split.num_layers, split.pp_size
    vp = split.virtual_size if split.interleaved else None
    first, last = split.first_layers, split.last_layers
    if first is not None or last is not None:
        left, stages = L - (first or 0) - (last or 0), P - (first is not None) - (last is not None)
        per_rank = left // stages if stages else 0
        if pp_rank == 0 and first is not None:
            per_rank = first
        if pp_rank == P - 1 and last is not None:
            per_rank = last
    else:
        per_rank = (L + split.account_for_embedding + split.account_for_loss) // P
    count = per_rank // vp if vp else per_rank
    if split.account_for_embedding and pp_rank == 0 and (vp_stage or 0) == 0:
        count -= 1
    if split.account_for_loss and pp_rank == P - 1 and (vp is None or vp_stage == vp - 1):
        count -= 1
    if first is not None or last is not None:
        middle_stages = P - (first is not None) - (last is not None)
        middle = L - (first or 0) - (last or 0)
        middle_rank = pp_rank if first is None else pp_rank - 1
        if vp:
            chunk_first, chunk_last = (first or 0) // vp, (last or 0) // vp
            chunk_middle = middle // vp
            total = chunk_first + chunk_middle + chunk_last
            offset = vp_stage * total if pp_rank == 0 else \
                vp_stage * total + chunk_first + middle_rank * (chunk_middle // middle_stages)
        else:
            per_middle = middle // middle_stages if middle_stages else 0
            offset = 0 if pp_rank == 0 else middle_rank * per_middle + (first or 0)
    else:
        counted = L + split.account_for_embedding + split.account_for_loss
        per_pipeline_rank = counted // P
        if vp:
            offset = vp_stage * (counted // vp) + pp_rank * (per_pipeline_rank // vp)
        else:
            offset = pp_rank * per_pipeline_rank
        if split.account_for_embedding and not (pp_rank == 0 and (vp_stage or 0) == 0):
            offset -= 1
    return list(range(offset, offset + count))


SPLITS = [PipelineSplit(8, 4), PipelineSplit(8, 4, 2), PipelineSplit(8, 2, 4), PipelineSplit(12, 4, 3),
          PipelineSplit(12, 4, first_layers=2, last_layers=2), PipelineSplit(10, 4, first_layers=1),
          PipelineSplit(10, 4, last_layers=4), PipelineSplit(10, 4, 2, first_layers=4, last_layers=2),
          PipelineSplit(32, 4, 2, first_layers=6, last_layers=10), PipelineSplit(6, 4, 2, account_for_embedding=True,
                                                                                 account_for_loss=True),
          PipelineSplit(10, 4, 3, account_for_embedding=True, account_for_loss=True),
          PipelineSplit(7, 4, account_for_embedding=True), PipelineSplit(11, 4, account_for_loss=True)]


@pytest.mark.parametrize("split", SPLITS, ids=lambda split: split.describe())
def test_pipeline_split_is_megatrons(split):
    """Every (stage, chunk) builds the layers Megatron-core's rule gives it, and together they
    build each layer once, in the order of the virtual stages."""
    assert not split.problems()
    order = [i for v in range(split.virtual_size) for p in range(split.pp_size) for i in split.layer_range(p, v)]
    assert order == list(range(split.num_layers))
    for p in range(split.pp_size):
        for v in range(split.virtual_size):
            assert list(split.layer_range(p, v)) == megatron_layers(split, p, v), (p, v)


@pytest.mark.parametrize("split, problem", [
    (PipelineSplit(6, 4), "--num-layers 6 cannot be split into 4 equal stages"),
    (PipelineSplit(8, 4, 3), "the 2 layers of a stage cannot be cut into 3 model chunks"),
    (PipelineSplit(10, 4, first_layers=1, last_layers=2), "the 7 remaining layers cannot be split evenly into 2"),
    (PipelineSplit(10, 4, 2, first_layers=3), "--decoder-first-pipeline-num-layers: 3 layers cannot be cut into"),
    (PipelineSplit(8, 4, first_layers=2, account_for_loss=True), "cannot be combined with"),
    (PipelineSplit(4, 4, first_layers=2, last_layers=2), "0 layers are left for 2 middle stages"),
    (PipelineSplit(2, 4, 2, account_for_embedding=True, account_for_loss=True), "cannot be cut into 2 model"),
])
def test_pipeline_split_problems_name_the_flags(split, problem):
    assert any(problem in message for message in split.problems()), split.problems()


@pytest.mark.parametrize("pp_size, virtual_size, m, group", [(2, 2, 4, 2), (3, 2, 6, 3), (4, 2, 4, 4), (4, 3, 8, 4),
                                                              (4, 2, 11, 7), (4, 2, 10, 5), (4, 2, 2 * 4, 8)])
def test_interleaved_order_runs_on_every_stage_without_deadlock(pp_size, virtual_size, m, group):
    """Every stage's interleaved schedule, simulated together: sends never wait, a receive waits
    for its message; all of them finish, each receives exactly the message meant for it (the
    links carry them in the order asked for), and each chunk runs its micro-batches' forwards
    and backwards in order, a backward after its forward; held forwards stay within Megatron's
    warm-up bound."""
    assert check_interleaved_micro_batches(pp_size, group, m) is None
    plans = [interleaved_one_f_one_b(pp_size, p, virtual_size, m, group) for p in range(pp_size)]
    # (stage, chunk) -> where its output goes, and its input gradient
    def downstream(p, v):
        return (p + 1, v) if p < pp_size - 1 else (0, v + 1)
    queues = {}                                         # (sender stage, receiver stage, kind) -> keys
    done, position = [[] for _ in range(pp_size)], [0] * pp_size
    progress = True
    while progress:
        progress = False
        for p in range(pp_size):
            while position[p] < len(plans[p]):
                kind, (v, i) = plans[p][position[p]]
                if kind == "send_forward":
                    q, w = downstream(p, v)
                    queues.setdefault((p, q, "F"), []).append((w, i))
                elif kind == "send_backward":
                    q, w = (p - 1, v) if p > 0 else (pp_size - 1, v - 1)
                    queues.setdefault((p, q, "B"), []).append((w, i))
                elif kind in ("recv_forward", "recv_backward"):
                    sender = (p - 1) % pp_size if kind == "recv_forward" else (p + 1) % pp_size
                    waiting = queues.get((sender, p, "F" if kind == "recv_forward" else "B"), [])
                    if not waiting:
                        break
                    assert waiting.pop(0) == (v, i), (p, kind, v, i)
                else:
                    done[p].append((kind, v, i))
                position[p] += 1
                progress = True
    assert position == [len(plan) for plan in plans], "deadlock"
    assert not any(queues.values())
    for p in range(pp_size):
        for v in range(virtual_size):
            assert [i for kind, c, i in done[p] if kind == "forward" and c == v] == list(range(m))
            assert [i for kind, c, i in done[p] if kind == "backward" and c == v] == list(range(m))
        held, most = set(), 0
        for kind, v, i in done[p]:
            if kind == "forward":
                held.add((v, i))
                most = max(most, len(held))
            else:
                held.remove((v, i))
        # Megatron's warm-up: this many forwards before the first backward, all of them held then
        warmup = min(2 * (pp_size - p - 1) + (virtual_size - 1) * group, m * virtual_size)
        before = next(k for k, (kind, _, _) in enumerate(done[p]) if kind == "backward")
        assert before == min(warmup + 1, m * virtual_size) == most


def test_interleaved_micro_batch_rules():
    assert "groups of 4 micro-batches but a step has 2" in check_interleaved_micro_batches(4, 4, 2)
    assert "leave a last group of 1" in check_interleaved_micro_batches(4, 4, 5)
    assert check_interleaved_micro_batches(4, 4, 8) is None


# Every pipeline run logs Megatron's statistics: the layouts check them (assert_same_statistics).
FOUR_LAYERS = [("4" if a == "2" and TINY[k - 1] == "--num-layers" else a) for k, a in enumerate(TINY)] + [*STATISTICS]
PP2 = ("--pipeline-model-parallel-size", "2")
PP2_TP2 = (*PP2, "--tensor-model-parallel-size", "2")


ONE_MICRO_BATCH = ("--global-batch-size", "2")
# The interleaved schedule on 4 stages of a 10-layer model: uneven stages (4 | 2 | 2 | 2 layers, 2
# chunks each), and the embedding and loss counted as layers (3 chunks, the first and last empty);
# 6 iterations (4 processes of a 10-layer pipeline take ~2 s an iteration here), evaluated at 3 and 6.
TEN_LAYER_RUN = ("--num-layers", "10", "--train-iters", "6", "--eval-interval", "3")
TEN_LAYERS = (*TEN_LAYER_RUN, "--save-interval", "3")
PP4 = ("--pipeline-model-parallel-size", "4")
VP_UNEVEN = (*PP4, *TEN_LAYERS, "--num-virtual-stages-per-pipeline-rank", "2", "--decoder-first-pipeline-num-layers",
             "4", "--decoder-last-pipeline-num-layers", "2")
VP_ACCOUNTED = (*PP4, *TEN_LAYERS, "--num-virtual-stages-per-pipeline-rank", "3",
                "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
# PP=2 x DP=2, fp16 in a pipeline and selective recompute are also run elsewhere with these tiny
# models: tests/test_zero.py (PP=2 x DP=2 with ZeRO-3 and full recompute; Rapidformer's fp16 set at
# PP=2 x TP=2 x DP=2, its overflows skipped as in one process), tests/test_llama.py (PP=2 x DP=2,
# PP=2 x TP=2), tests/test_parallel.py (selective recompute).
PIPELINE_RUNS = [(1,), (2, *PP2), (1, *TEN_LAYERS), (4, *VP_UNEVEN), (4, *VP_ACCOUNTED), (4, *PP2_TP2),
                 (1, *ONE_MICRO_BATCH), (2, *PP2, *ONE_MICRO_BATCH), (2, *PP2, "--checkpoint-activations")]


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
        iterations = int(flag_value(flags, "--train-iters", 12))
        assert len(found) == 2 * (iterations - len(skipped(log))) + 3, log[-2000:]   # (loss, norm) per update, 3 validations
        return found, save, log
    return run


def flag_value(flags, name, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


@pytest.mark.parametrize("nproc, layout", [(2, PP2), (4, VP_UNEVEN), (4, VP_ACCOUNTED), (4, PP2_TP2)],
                         ids=["pp2", "pp4-interleaved-uneven", "pp4-interleaved-embedding-loss-counted", "pp2xtp2"])
def test_pipeline_reproduces_one_process(pipeline_runs, nproc, layout):
    found, save, log = pipeline_runs(nproc, *layout)
    ten = TEN_LAYERS[0] in layout
    reference, single_save, _ = pipeline_runs(1, *TEN_LAYERS) if ten else pipeline_runs(1)
    tp, iterations = int(flag_value(layout, "--tensor-model-parallel-size", 1)), int(flag_value(layout, "--train-iters", 12))
    if layout == VP_UNEVEN:
        assert " > pipeline split: layers per stage 2+2 | 1+1 | 1+1 | 1+1 (interleaved 1F1B, 2 model chunks" in log
    if layout == VP_ACCOUNTED:
        assert " > pipeline split: layers per stage 0+1+1 | 1+1+1 | 1+1+1 | 1+1+0 (interleaved 1F1B, 3 model" in log
    assert_layout(save, tp=tp, world_size=nproc, pp=int(flag_value(layout, "--pipeline-model-parallel-size")))
    assert len(reference) == 2 * iterations + 3
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, f"iter_{iterations:07d}", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)
    assert_same_statistics(save, single_save, tp, vocab_size, iterations=iterations,
                           num_layers=int(flag_value(layout, "--num-layers", flag_value(FOUR_LAYERS, "--num-layers"))))


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


def test_full_recompute_in_a_pipeline_prints_exactly_the_run_without_it(pipeline_runs):
    found, _, log = pipeline_runs(2, *PP2, "--checkpoint-activations")
    reference, _, reference_log = pipeline_runs(2, *PP2)
    assert "activation recompute: full, uniform, 1 layer(s) (2 cells marked)" in log      # rank 0's 2 layers
    assert "activation recompute" not in reference_log
    assert found == reference


def test_pipeline_checkpoints_resume_and_evaluate_in_one_process(pipeline_runs, env, tmp_path):
    found, save, _ = pipeline_runs(4, *PP2_TP2)
    reference, _, _ = pipeline_runs(1)
    status, log = single(FOUR_LAYERS + ["--load", checkpoint_of(save, 6, tmp_path / "six"),
                                        "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert "saved at tensor-parallel size 2, resharded to 1, pipeline size 2 read as 1" in log
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])    # iterations 7..12, the last 2 validations
    # The interleaved run's stages hold other layers than an even split's: each tensor is found in
    # the stage that saved it (metadata.json records them), and one process evaluates its model.
    found, save, _ = pipeline_runs(4, *VP_UNEVEN)
    stage_layers = json.loads(Path(save, "iter_0000006", "metadata.json").read_text())["parallel"]["stage_layers"]
    assert stage_layers == [[0, 1, 5, 6], [2, 7], [3, 8], [4, 9]]
    status, log = single(FOUR_LAYERS + [*TEN_LAYER_RUN, "--load", str(save), "--skip-train"], env)
    assert status == 0, log[-3000:]
    assert "pipeline size 4 read as 1" in log
    assert_same_run(values(log), found[-1:])           # the interleaved run's final validation loss
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
            output = StageForward(lambda s: stage(Tensor(np.float32(s))), stage, loss_chunk=None)(scale, inputs)
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
