"""ZeRO's optimizer wrappers. Stages 1 and 2 (stage 1 is Megatron's distributed optimizer,
`--use-distributed-optimizer`): each data-parallel rank keeps the fp32 main parameters and the
optimizer state of 1/N of the model, steps them, and the updated parameters are all-gathered; at
stage 2 it is also handed only its 1/N of the gradients. Stage 3 (FullyShardedOptimizerWrapper, at
the end): the model itself holds only this rank's pieces (rapidgpt/parallel/fully_sharded.py).

Layout (ShardPlan, rapidgpt/parallel/data_parallel.py): the model's parameters laid end to end, in
order, as one flat vector of Psi elements padded to N x S (S = ceil(Psi / N)); data-parallel rank
r owns elements [r S, (r+1) S): of every parameter, the piece of its flattened elements that falls
in that range (a parameter may be cut between two ranks). The pieces are fp32 Parameters
(`zero_shard.<name>`, 1-D) that the inner optimizer (RapidGPT's AdamW or SGD, rebuilt over them,
each piece in the groups -- weight decay, rate, eps -- of the parameter it is cut from) steps.
Both optimizers are elementwise, so every element gets the very update an unsharded run computes.

A step, stage 1: the wrapper's unscale, norm, overflow check and clip see the whole
data-parallel-averaged gradients, as without ZeRO (rapidgpt/optim/mixed_precision.py); each rank
then steps its pieces with its pieces of the gradients. Stage 2: the schedule reduce-scatters the
gradients into this rank's pieces (`gradient_layout`, rapidgpt/training/schedules.py), so the
whole gradients never outlive the step's backward; unscale and clip act on the pieces, and the
global norm adds every rank's sums of squares over all ranks (DP x TP x PP: each DP rank holds
different elements), so the norm, the overflow decision and the clip factor are the ones of an
unsharded run on every rank. Then, both stages, one all-gather of the [N x S] fp32 vector over the
data-parallel group (rapidgpt.parallel.comm: native on HCCL/NCCL, exact on CPU) gives every
model parameter its updated elements (cast to 16 bits in fp16/bf16 runs).

Memory per rank at the step boundary (fp16 with Adam, gradients reduced in fp16; gradients count
4 bytes instead of 2 when they are accumulated in fp32): stage 1, weights and gradients as
without ZeRO, main parameters and optimizer state 1/N: 2 Psi + 2 Psi + 12 Psi / N bytes (the ZeRO
paper's 4 Psi + 12 Psi / N); stage 2, the gradients 1/N too: 2 Psi + 14 Psi / N. In fp32 runs the
main pieces are copies of the model's elements (MindSpore has no Parameter that is a view of
another): 4 Psi + 4 Psi + 12 Psi / N at stage 1. Within the step, stage 2 still accumulates the
micro-batches into whole gradients (as Megatron does) and reduce-scatters one flat copy of them
(Megatron cuts its buffer into buckets; one vector is simpler and costs one more gradient-sized
buffer while the reduction runs).

Checkpoints hold the same tensors as without ZeRO (each parameter's fp32 value and its optimizer
state under the parameter's name, whole): `checkpoint_tensors` returns ShardedState entries
that are gathered when saved and cut to this rank's pieces when loaded, so a checkpoint resumes at
any data-parallel size, with or without ZeRO.
"""

import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, ops

from rapidgpt.optim.mixed_precision import OptimizerWrapper, checkpoint_name
from rapidgpt.parallel import comm
from rapidgpt.parallel.data_parallel import REDUCED_IN_BACKWARD, ShardedKind, ShardedState, ShardPlan, padded_cat
from rapidgpt.parallel.state import (get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size,
                                     get_parallel_state)
from rapidgpt.tensor_tuples import after, map_tensors

PIECE_PREFIX = "zero_shard."


def _piece_of(grads, i, first, end):
    """Elements [first, end) of gradient i, flattened."""
    return grads[i].reshape(-1)[first:end]


class DistributedOptimizerWrapper(OptimizerWrapper):
    """OptimizerWrapper with ZeRO stage 1, or 2 with `shard_gradients` (see the module docstring).
    `make_optimizer(pieces, owners)` builds the inner optimizer over the pieces, each in the groups
    (weight decay, rate, eps) of its owner, the model parameter it is cut from."""

    def __init__(self, model_params, make_optimizer, precision, clip_grad, shard_gradients=False):
        self.shards_gradients = shard_gradients             # a bool for the graph: gradient_layout is set
        super().__init__(model_params, make_optimizer, precision, clip_grad)
        self.pieces_in_norm = tuple(self.in_norm[i] for i, _, _ in self.plan.pieces)
        if shard_gradients:
            self.gradient_layout = self.plan
            self.in_norm = self.pieces_in_norm

    def _params_norm_layout(self):
        """The main parameters are this rank's pieces, each data-parallel rank holding others: every
        rank's sums of squares (both stages)."""
        return self.pieces_in_norm, comm.new_group(range(get_parallel_state().world_size))

    def _norm_group(self):
        """ZeRO-2: every rank (DP x TP x PP), each data-parallel rank holding other pieces."""
        if not self.shards_gradients:
            return super()._norm_group()
        return comm.new_group(range(get_parallel_state().world_size))

    def _build_main_params(self, make_optimizer):
        group = get_data_parallel_group()
        self.plan = ShardPlan([tuple(p.shape) for p in self.parameters], get_data_parallel_world_size(),
                              get_data_parallel_rank())
        if (self.plan.size - 1) * self.plan.shard >= self.plan.total:   # decided alike on every rank
            raise ValueError(f"ZeRO: the model's {self.plan.total} parameters are too few to give each of "
                             f"{self.plan.size} data-parallel ranks a piece")
        self.main_params = ParameterTuple(
            Parameter(Tensor(self.parameters[i].value().astype(ms.float32).asnumpy().reshape(-1)[lo:hi].copy()),
                      name=PIECE_PREFIX + self.parameters[i].name, requires_grad=False)
            for i, lo, hi in self.plan.pieces)
        self.optimizer = make_optimizer(self.main_params, tuple(self.parameters[i] for i, _, _ in self.plan.pieces))
        self.all_gather = comm.AllGather(group, axis=0)

    def sharding_note(self):
        return f" (ZeRO stage {2 if self.shards_gradients else 1}: 1/{self.plan.size} of the flat parameters)"

    def gather_pieces(self, pieces):
        """Every model parameter's whole value (fp32, in model order) from this rank's `pieces` (one
        tensor per piece, in plan order) and the other data-parallel ranks'."""
        return self.plan.split(self.all_gather(padded_cat(pieces, self.plan.padding, ms.float32)))

    def step(self, grads, lr):
        if not self.shards_gradients:
            grads = map_tensors(ops.partial(_piece_of, grads), *self.plan.piece_columns)
        done = self.optimizer(grads, lr)
        whole = self.gather_pieces(map_tensors(ops.partial(after, done), self.main_params))
        return ops.depend(done, self.assign_model_params(done, self.parameters, whole))

    # -- checkpoints: the tensors an unsharded run saves, whole ----------------------------------

    def checkpoint_tensors(self, with_state):
        """{checkpoint name: ShardedState or Parameter}: each model parameter's fp32 value (its main
        pieces) and with `with_state` the optimizer state of each (Adam's m and v, SGD's momentum)
        under the names an unsharded fp32 run gives them, then the unsharded state (step, lr,
        loss scaler)."""
        tensors = self._sharded(self.main_params, "")
        if with_state:
            position = {p.name: k for k, p in enumerate(self.main_params)}
            by_prefix = {}
            for p in self.optimizer.get_parameters():
                prefix, sep, rest = p.name.partition(PIECE_PREFIX)
                if not sep:
                    tensors[p.name] = p                     # step count, learning rate
                elif prefix:                                # "adam_m.", ...; not the pieces themselves
                    by_prefix.setdefault(prefix, []).append((position[PIECE_PREFIX + rest], p))
            for prefix, pieces in by_prefix.items():
                tensors.update(self._sharded([p for _, p in sorted(pieces, key=lambda x: x[0])], prefix))
            if self.grad_scaler is not None:
                tensors.update({p.name: p for p in self.grad_scaler.get_parameters()})
        return tensors

    def _sharded(self, pieces, prefix):
        kind = ShardedKind(self, tuple(pieces))
        return {prefix + p.name: ShardedState(kind, i, p.shape) for i, p in enumerate(self.parameters)}

    def reload_model_params(self):
        """After the pieces were loaded: every model parameter from them (all data-parallel ranks).
        Set from host copies: a slice of the gathered vector is a view, which the in-place updates
        of the compiled step refuse."""
        for model_param, value in zip(self.parameters, self.gather_pieces(tuple(p.value() for p in self.main_params))):
            model_param.set_data(self.model_value(Tensor(value.asnumpy()), model_param))


class FullyShardedOptimizerWrapper(OptimizerWrapper):
    """ZeRO stage 3: the model's parameters are already this rank's pieces of each layer
    (`units`: the model's ShardedWeights, rapidgpt/parallel/fully_sharded.py), and the backward of
    their gathers hands over their gradients summed over the data-parallel ranks. So the wrapper
    is the unsharded one over the pieces (fp32 main copies of them in 16-bit runs, the inner
    optimizer rebuilt over those, each piece in the groups of the parameter it is cut from),
    except that the global norm adds every rank's sums of squares over all ranks, as at stage 2, and that
    checkpoints hold each parameter and its optimizer state whole. After the update nothing is
    gathered: the next forward gathers what it needs."""

    def __init__(self, units, make_optimizer, precision, clip_grad):
        self.units = tuple(units)
        super().__init__([piece for unit in self.units for piece in unit.pieces], make_optimizer, precision, clip_grad)
        self.gradient_layout = REDUCED_IN_BACKWARD

    def _norm_group(self):
        return comm.new_group(range(get_parallel_state().world_size))

    def sharding_note(self):
        size = self.units[0].plan.size if self.units else 1
        return f" (ZeRO stage 3: 1/{size} of each layer's parameters)"

    def checkpoint_tensors(self, with_state):
        """{checkpoint name: ShardedState or Parameter}: what an unsharded fp32 run saves (see
        OptimizerWrapper.checkpoint_tensors), each parameter's value and optimizer state gathered
        whole from its unit's pieces."""
        index = {checkpoint_name(main.name): k for k, main in enumerate(self.main_params)}
        kinds = {"": list(self.main_params)}          # name prefix -> that kind's pieces, in main order
        tensors = {}
        if with_state:
            for p in self.optimizer.get_parameters():
                name = checkpoint_name(p.name)
                kind, _, owner = name.partition(".")     # "adam_m" + a main parameter's name
                if owner in index:
                    kinds.setdefault(kind + ".", [None] * len(index))[index[owner]] = p
                elif name not in index:
                    tensors[name] = p                    # step count, learning rate
            if self.grad_scaler is not None:
                tensors.update({p.name: p for p in self.grad_scaler.get_parameters()})
        for prefix, pieces in kinds.items():
            start = 0
            for unit in self.units:
                tensors.update(unit.whole_states(pieces[start:start + len(unit.pieces)], prefix))
                start += len(unit.pieces)
        return tensors
