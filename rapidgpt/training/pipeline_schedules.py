"""Pipeline-parallel steps: Megatron's 1F1B schedule (training) and forward-only (evaluation),
run by the host, then the same compiled optimizer wrapper as without pipelining.

How a stage's micro-batch is differentiated (measured with MindSpore 2.10). 1F1B runs the OLDEST
pending micro-batch's backward first, while later micro-batches' forwards are still pending;
MindSpore's public ways do not fit: pending `mindspore.vjp` closures can only be run newest first
("Can not find top cell for backward"), and a backward graph (`GradOperation` with an output
gradient) recomputes the forward. So the forward runs in PyNative with autograd recording on
(each output keeps what its backward needs) and each backward is started from its micro-batch's
output by MindSpore's autograd engine (the one behind its PyTorch-style autograd), in any order,
seeded with the output gradient received from the next stage. Both are internal APIs
(`autograd_recording` and `backward_of` in rapidgpt/mindspore_private.py).

What is compiled (rapidgpt/training/model_transforms.py, compile_pipeline_stage): the stage's
layers as one `mindspore.jit` graph, each cell holding a tensor-parallel boundary (the
vocabulary-parallel embedding), the output layer and loss, and the embedding dropout (the last two
several times faster compiled); the rest of the stage (embedding sums, the user's forward hook)
runs in PyNative, and the optimizer wrapper is one compiled graph. Why: a whole-stage graph cannot see Megatron's `set_input_tensor` (a Python attribute; the
AST capture drops assignments inside graphs, and a traced capture returned its gradients in the
wrong order), while a graph called from a recorded forward keeps its forward's activations for its
backward (each forward runs once, counted in tests/test_pipeline.py); custom backwards and
recompute only work inside a graph. A whole 1F1B step cannot be one graph: its point-to-point
exchanges must interleave with the neighbours' in the schedule's order.

Compiled before the first exchange. MindSpore 2.10's CPU collectives and point-to-point receives
give up after 30 s (measured: an irecv or AllReduce whose peer comes 50 s late fails with "Recv
failed" / "Launch kernel failed" after 30 s; MS_RECEIVE_MSG_TIMEOUT does not change it, and a
receive retried after that gets the wrong message). Compiled lazily, a stage's first receive
would wait for its neighbours' compilations (all of the previous stages' forward, then the later
stages' forward and backward), which on a loaded machine took longer (an 8-rank CI run failed so).
So the first training step and the first evaluation first run micro-batch 0 through this stage
alone (inputs of zeros from no neighbour, results dropped: `warm_up`), then meet at a barrier (an
all-reduce, which waits --distributed-timeout-minutes for the slowest rank: rapidgpt/parallel/comm.py,
set_collective_timeout); the exchanges then only wait for computation.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from rapidgpt.config.pipeline_split import check_interleaved_micro_batches
from rapidgpt.global_vars import get_timers
from rapidgpt.mindspore_private import autograd_recording, backward_of, synchronize
from rapidgpt.parallel import comm
from rapidgpt.parallel.comm import InterleavedScheduleError
from rapidgpt.parallel.pipeline import (ModelChunks, RingLinks, StageLinks, forward_only, interleaved_forward_only,
                                       interleaved_one_f_one_b, one_f_one_b)
from rapidgpt.parallel.random import set_dropout_key
from rapidgpt.parallel.state import (get_data_parallel_rank, get_data_parallel_world_size,
                                     get_embedding_group, get_pipeline_model_parallel_group,
                                     get_pipeline_model_parallel_rank, get_pipeline_model_parallel_world_size,
                                     get_pipeline_neighbour_groups)
from rapidgpt.training.step import allow_call_depth_for
from rapidgpt.training.schedules import (DataParallelFinalize, accumulate, add_stats, casts_to_fp32, loss_and_stats,
                                         loss_multiplier, micro_batch_dropout_key, per_token_finalize,
                                         rounds_to_bf16, select_micro_batch, stacked_losses, unstacked_losses)
from rapidgpt.training.step import compile_then_meet, floats, step_result


# --timing-log-level 2: Megatron's compute timers, and the time in point-to-point exchanges
# (waiting for the neighbour included: the pipeline bubble, benchmarks/bench_parallel.py).
TIMER_OF = {"forward": "forward-compute", "backward": "backward-compute"}


def stage_output(output):
    """What a stage that is not the last sends on: the forward hook's output (Megatron's
    `(output, loss_fn)`: the loss function is only called on the last stage)."""
    return output[0] if isinstance(output, tuple) else output


def _backward(output, output_grad, inputs):
    """Gradients of `output` (seeded with `output_grad`) with respect to `inputs` (tensors or
    Parameters), nothing accumulated anywhere; zeros for an input the output does not reach."""
    grads = backward_of(output, output_grad, inputs)
    return tuple(ops.zeros_like(x) if g is None else g for g, x in zip(grads, inputs))


class StageForward:
    """One micro-batch through one of this stage's model chunks (the only one without the
    interleaved schedule): the forward hook's output, or on the chunk that ends the model
    (`loss_chunk`; None on other stages) its `(loss, stats)` in fp32. `input_tensor` (all but
    the model's first chunk) reaches the model through set_input_tensor."""

    def __init__(self, forward, model, loss_chunk, per_token=False):
        self.forward, self.model, self.loss_chunk, self.per_token = forward, model, loss_chunk, per_token

    def __call__(self, micro_batch, input_tensor=None, chunk=0):
        if isinstance(self.model, ModelChunks):
            self.model.select(chunk)
        if input_tensor is not None:
            self.model.set_input_tensor(input_tensor)
        output = self.forward(micro_batch)
        if chunk == self.loss_chunk:
            return loss_and_stats(output, self.per_token)
        return stage_output(output)


def warm_up(run_forward, micro_batch, chunks, like, training):
    """Compile this stage's pieces without its neighbours: micro-batch 0's forward through each of
    `chunks` (`(chunk, takes tokens, computes the loss, its parameters)`; a chunk that does not
    take tokens gets a zero input, `like` the activations' shape and dtype) and, `training`, its
    backward, results dropped; then a barrier of all ranks (see the module docstring). No state
    changes: no gradient is accumulated and the caller sets the dropout key and input tensor
    again before each real forward."""
    for chunk, first, last, params in chunks:
        received = None if first else ops.zeros_like(like)
        if not training:
            run_forward(micro_batch, received, chunk)
            continue
        if received is not None:
            received.requires_grad_()
        with autograd_recording():
            output = run_forward(micro_batch, received, chunk)
            output = output[0] if last else output
        _backward(output, ops.ones_like(output), params if first else tuple(params) + (received,))
    synchronize()
    comm.barrier()


class StatNames:
    """The names of the loss function's statistics (Megatron's loss dict), which only the last
    stage sees, told once to every stage so that all of them take part in summing the values over
    the pipeline group: the names as UTF-8 bytes in a fixed-size vector, summed over the group
    (every other stage adds zeros)."""

    SIZE = 1024

    def __init__(self, last):
        self.last, self.names = last, None
        self.sum = comm.AllReduce(get_pipeline_model_parallel_group())

    def learn(self, stats):
        """The names (`stats`: on the last stage its statistics' names or {name: value}, ignored
        elsewhere), exchanged once: every stage calls this at the same point of a step."""
        if self.names is None:
            data = "\n".join(stats).encode("utf-8") if self.last else b""
            vector = np.zeros(1 + self.SIZE, np.float32)          # [length, bytes...]
            vector[0] = len(data)
            vector[1:1 + min(len(data), self.SIZE)] = np.frombuffer(data[:self.SIZE], np.uint8)
            summed = self.sum(Tensor(vector)).asnumpy()
            if summed[0] > self.SIZE:                             # every stage stops alike
                raise ValueError(f"the loss function's statistics have names of {int(summed[0])} bytes in "
                                 f"all; keep them under {self.SIZE}")
            text = summed[1:1 + int(summed[0])].astype(np.uint8).tobytes().decode("utf-8")
            self.names = text.split("\n") if text else []
        return self.names

    def stacked(self, loss, stats, extra=0):
        """`[1 + extra + k]` on every stage: the last stage's loss and `stats` (`extra` values, e.g.
        the token count, then the k statistics; zeros elsewhere)."""
        if self.last:
            return stacked_losses(loss, stats)
        return ops.zeros((1 + extra + len(self.names),), ms.float32)


class ForwardBackwardPipelining:
    """Megatron's forward_backward_pipelining_without_interleaving for this rank's stage, or with
    `virtual_size` V > 1 model chunks (a ModelChunks model) its _with_interleaving
    (rapidgpt/parallel/pipeline.py gives both orders; `group_size`: the interleaved schedule's
    micro-batch group).

    `schedule(stacked, iteration, loss_scale) -> (mean loss of the step, {name: mean statistic},
    grads)` on every stage (the last stage's loss and statistics), grads in `params` order, summed over the micro-batches (each micro-batch's
    loss multiplied by loss_scale / (m * dp), as without pipelining), then over the data-parallel
    ranks and, for the tied word embeddings, over the embedding group (first + last stage); with a
    `gradient_layout` (ZeRO-2) the embedding group first, then reduce-scattered into its pieces.
    Each chunk's backwards run in micro-batch order, so its gradients are summed in the order of
    the single-process step.
    """

    def __init__(self, forward, model, params, num_micro_batches, activation_shape, activation_dtype,
                 accumulate_in_fp32=True, gradient_layout=None, per_token=False, virtual_size=1, group_size=None):
        self.pp_size, self.stage = get_pipeline_model_parallel_world_size(), get_pipeline_model_parallel_rank()
        self.first, self.last = self.stage == 0, self.stage == self.pp_size - 1
        self.virtual_size, self.group_size = virtual_size, group_size or self.pp_size
        self.params = tuple(params)
        self.m = num_micro_batches
        self.per_token = per_token
        self.token_chunk = 0 if self.first else None                    # the chunk that embeds the tokens
        self.loss_chunk = virtual_size - 1 if self.last else None       # the chunk that computes the loss
        self.run_forward = StageForward(forward, model, self.loss_chunk, per_token)
        # Each chunk's parameters, as positions in `params` (one chunk: all of them).
        position = {id(p): k for k, p in enumerate(self.params)}
        self.chunk_positions = ([[position[id(p)] for p in chunk.get_parameters() if id(p) in position]
                                 for chunk in model.chunks] if virtual_size > 1 else [list(range(len(self.params)))])
        orphans = sorted(set(range(len(self.params))) - {k for chunk in self.chunk_positions for k in chunk})
        if orphans:
            raise InterleavedScheduleError(
                f"the optimizer updates {', '.join(self.params[k].name for k in orphans[:3])}, which no model chunk "
                f"holds; under the interleaved schedule every trained parameter must be one of a chunk's")
        links = RingLinks if virtual_size > 1 else StageLinks
        self.links = links(*get_pipeline_neighbour_groups(ring=virtual_size > 1), activation_shape, activation_dtype)
        self.cast_to_fp32 = casts_to_fp32(self.params, accumulate_in_fp32)
        self.round_bf16 = rounds_to_bf16(self.params, accumulate_in_fp32)
        self.dp_size, self.dp_rank = get_data_parallel_world_size(), get_data_parallel_rank()
        self.finalize_dp = DataParallelFinalize(self.params, self.cast_to_fp32, gradient_layout, self.round_bf16)
        self.shared = [i for i, p in enumerate(self.params) if getattr(p, "pipeline_shared", False)]
        self.embedding_sum = comm.AllReduce(get_embedding_group()) if self.shared else None
        self.pipeline_sum = comm.AllReduce(get_pipeline_model_parallel_group())
        self.stat_names = StatNames(self.last)
        self.timers = get_timers()
        self.warmed_up = False

    def chunk_params(self, chunk):
        return tuple(self.params[k] for k in self.chunk_positions[chunk])

    def actions(self):
        """This stage's schedule as `(kind, (chunk, micro-batch))` (combined kinds: a pair of them)."""
        if self.virtual_size > 1:
            message = check_interleaved_micro_batches(self.pp_size, self.group_size, self.m)
            if message:
                raise InterleavedScheduleError(message)
            return interleaved_one_f_one_b(self.pp_size, self.stage, self.virtual_size, self.m, self.group_size)
        return [(kind, ((0, index[0]), (0, index[1])) if isinstance(index, tuple) else (0, index))
                for kind, index in one_f_one_b(self.pp_size, self.stage, self.m)]

    def __call__(self, stacked, iteration, loss_scale):
        m, dp = self.m, self.dp_size
        multiplier = Tensor(loss_multiplier(loss_scale, m, dp, self.per_token), ms.float32)
        keys = [micro_batch_dropout_key(iteration, i, dp, self.dp_rank) for i in range(m)]
        batches = [select_micro_batch(stacked, i) for i in range(m)]
        if not self.warmed_up:
            set_dropout_key(keys[0])
            warm_up(self.run_forward, batches[0], [(c, c == self.token_chunk, c == self.loss_chunk,
                                                     self.chunk_params(c)) for c in range(self.virtual_size)],
                    self.links.like, training=True)
            self.warmed_up = True
        inputs, outputs, output_grads, input_grads = {}, {}, {}, {}
        chunk_grads = [None] * self.virtual_size
        total, stats, names = None, None, []

        def forward_step(key):
            nonlocal total, stats, names
            chunk, i = key
            set_dropout_key(keys[i])
            with autograd_recording():
                if chunk == self.token_chunk:
                    output = self.run_forward(batches[i], None, chunk)
                else:
                    inputs[key].requires_grad_()
                    output = self.run_forward(batches[i], inputs[key], chunk)
                if chunk == self.loss_chunk:
                    output, tokens, micro_stats = output
                    total = output if total is None else total + output
                    values = tuple(ops.stop_gradient(v) for v in micro_stats.values())
                    stats = add_stats(stats, values if tokens is None else (ops.stop_gradient(tokens),) + values)
                    names = list(micro_stats)
                    output = output * multiplier
            outputs[key] = output           # held (with what its backward needs) until its backward

        def backward_step(key):
            chunk, i = key
            # Recompute reruns dropout in the backward, which reads the key: set it as in the forward
            # (without, selective recompute in a pipeline changed the grad norm in the 4th digit).
            set_dropout_key(keys[i])
            output = outputs.pop(key)
            seed = ops.ones_like(output) if chunk == self.loss_chunk else output_grads.pop(key)
            params = self.chunk_params(chunk)
            takes_tokens = chunk == self.token_chunk
            micro_grads = _backward(output, seed, params if takes_tokens else params + (inputs.pop(key),))
            if not takes_tokens:
                input_grads[key], micro_grads = micro_grads[-1], micro_grads[:-1]
            chunk_grads[chunk] = accumulate(chunk_grads[chunk], micro_grads, self.cast_to_fp32, self.round_bf16)

        for kind, key in self.actions():
            timer = self.timers(TIMER_OF.get(kind, "pipeline-p2p"), log_level=2)
            timer.start()
            if kind == "recv_forward":
                inputs[key] = self.links.recv_forward()
            elif kind == "forward":
                forward_step(key)
            elif kind == "send_forward":
                self.links.send_forward(ops.stop_gradient(outputs[key]))
            elif kind == "send_forward_recv_backward":
                sent, received = key
                output_grads[received] = self.links.send_forward_recv_backward(ops.stop_gradient(outputs[sent]))
            elif kind == "recv_backward":
                output_grads[key] = self.links.recv_backward()
            elif kind == "backward":
                backward_step(key)
            elif kind == "send_backward":
                self.links.send_backward(input_grads.pop(key))
            else:                           # send_backward_recv_forward
                sent, received = key
                inputs[received] = self.links.send_backward_recv_forward(input_grads.pop(sent))
            if self.timers.measuring(2):    # count asynchronous work in the action that queued it
                synchronize()
            timer.stop()
        self.links.finish()
        grads = [None] * len(self.params)
        for positions, summed in zip(self.chunk_positions, chunk_grads):
            for k, grad in zip(positions, summed or ()):
                grads[k] = grad
        grads = tuple(grads)
        names = self.stat_names.learn(names)
        loss = self.stat_names.stacked(ops.stop_gradient(total) if self.last else None, stats, int(self.per_token))
        if not self.per_token:      # per-token: sums, divided by the step's tokens below
            loss = loss / m
        if self.finalize_dp.sharded:
            # ZeRO-2: the tied embeddings first, as the DP reduction leaves pieces cut by each
            # stage's own layout. (Megatron's order, DP then embedding group, leaves both copies
            # the same bits whatever the DP collective's summation order; here the two stages'
            # reduce-scatters must sum alike, as the CPU emulation and a 2-rank DP group do.)
            loss, grads = self.finalize_dp(loss, self._sum_embedding_grads(grads))
        else:
            loss, grads = self.finalize_dp(loss, grads)
            grads = self._sum_embedding_grads(grads)
        values = self.pipeline_sum(loss)                # every stage: the last stage's
        if self.per_token:
            values, grads = per_token_finalize(values, grads, self.dp_size)
        loss, stats = unstacked_losses(values, names)
        return loss, stats, grads

    def _sum_embedding_grads(self, grads):
        """Megatron's finalize_model_grads: the tied embeddings' gradients summed over the
        embedding group (both copies then hold the same gradient)."""
        if self.embedding_sum is not None:
            grads = list(grads)
            for i in self.shared:
                grads[i] = self.embedding_sum(grads[i])
            grads = tuple(grads)
        return grads


class PipelineTrainStep:
    """`step(stacked, lr, iteration) -> StepResult` with pipeline parallelism: the 1F1B schedule
    (interleaved with `virtual_size` > 1), then the compiled optimizer wrapper (norm and overflow
    over TP x PP; every rank under ZeRO-2)."""

    def __init__(self, forward, model, optimizer, num_micro_batches, activation_shape, accumulate_in_fp32=True,
                 jit=True, per_token=False, virtual_size=1, group_size=None):
        dtype = optimizer.parameters[0].dtype
        self.schedule = ForwardBackwardPipelining(forward, model, optimizer.parameters, num_micro_batches,
                                                  activation_shape, dtype, accumulate_in_fp32,
                                                  optimizer.gradient_layout, per_token, virtual_size, group_size)
        self.gradient_bytes = self.schedule.finalize_dp.gradient_bytes
        self.optimizer = optimizer
        allow_call_depth_for(len(optimizer.parameters))
        self._update = ms.jit(optimizer.construct) if jit else optimizer
        self._jit, self._updated_once = jit, False

    def __call__(self, stacked, lr, iteration, validation=None):
        scale = float(self.optimizer.loss_scale())
        loss, stats, grads = self.schedule(stacked, Tensor(iteration, ms.uint32), scale)
        # mutable: a tuple argument is otherwise compiled as a constant, once per step.
        inputs = (ms.mutable(grads), Tensor(lr, ms.float32)) + \
            (() if validation is None else (Tensor(float(loss), ms.float32), Tensor(validation, ms.float32)))
        if not self._updated_once:          # its norm and overflow check are collectives
            compile_then_meet(self._update, inputs, comm.barrier if self._jit else None, "optimizer step")
            self._updated_once = True
        return step_result(self.optimizer, self._update(*inputs), float(loss), floats(stats))


class PipelineEvalStep:
    """`step(micro_batch) -> (loss, {name: statistic}, tokens)` on every stage: forward only, the
    loss computed on the last stage (as EvalStep's: sums and their tokens with `per_token`);
    through each model chunk in turn with `virtual_size` > 1."""

    def __init__(self, forward, model, activation_shape, dtype, per_token=False, virtual_size=1):
        pp_size, stage = get_pipeline_model_parallel_world_size(), get_pipeline_model_parallel_rank()
        self.first, self.last = stage == 0, stage == pp_size - 1
        self.virtual_size = virtual_size
        self.per_token = per_token
        self.run_forward = StageForward(forward, model, virtual_size - 1 if self.last else None, per_token)
        links = RingLinks if virtual_size > 1 else StageLinks
        self.links = links(*get_pipeline_neighbour_groups(ring=virtual_size > 1), activation_shape, dtype)
        self.pipeline_sum = comm.AllReduce(get_pipeline_model_parallel_group())
        self.stat_names = StatNames(self.last)
        self.actions = (interleaved_forward_only(pp_size, stage, virtual_size) if virtual_size > 1
                        else [(kind, (0, i)) for kind, i in forward_only(pp_size, stage, 1)])
        self.warmed_up = False

    def __call__(self, micro_batch):
        if not self.warmed_up:
            warm_up(self.run_forward, micro_batch, [(c, self.first and c == 0, self.last and c == self.virtual_size - 1,
                                                     ()) for c in range(self.virtual_size)],
                    self.links.like, training=False)
            self.warmed_up = True
        received, output = None, None
        for kind, (chunk, _) in self.actions:
            if kind == "recv_forward":
                received = self.links.recv_forward()
            elif kind == "forward":
                output = self.run_forward(micro_batch, None if self.first and chunk == 0 else received, chunk)
            else:
                self.links.send_forward(output)
        self.links.finish()
        loss, tokens, stats = output if self.last else (None, None, {})
        names = self.stat_names.learn(stats)
        values = tuple(stats.values()) if tokens is None else (tokens,) + tuple(stats.values())
        values = self.pipeline_sum(self.stat_names.stacked(loss, values, int(self.per_token)))
        if self.per_token:
            tokens, values = float(values[1]), ops.cat((values[:1], values[2:]))
        loss, stats = unstacked_losses(values, names)
        return float(loss), floats(stats), tokens if self.per_token else 1.0
