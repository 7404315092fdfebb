"""The optimizer wrapper: everything that happens to a step's gradients once the schedule
(rapidgpt/training/schedules.py) has produced them, as Megatron's MixedPrecisionOptimizer /
FP32Optimizer do it.

    grads            one per model parameter, in the model's dtype, averaged over the step's
                     micro-batches and the data-parallel ranks, multiplied by the loss scale
                     (ZeRO-2: only this rank's pieces of them, see distributed_optimizer.py;
                     ZeRO-3: the model's parameters are such pieces)
    prepare          16-bit runs: cast to fp32 (the main parameters' gradients)
    unscale          x 1 / loss scale (when the loss is scaled)
    norm, found_inf  the global L2 norm over the whole model: every rank adds the sums of squares
                     of the gradients it counts (its tensor-parallel shards, each replicated
                     parameter on one TP rank, the tied embeddings on the first pipeline stage
                     only) over the model-parallel group (TP x PP; under ZeRO-2 and 3 over every rank,
                     each data-parallel rank holding other pieces). found_inf = the norm is
                     not finite, so every rank of the model-parallel group agrees on it, and the
                     data-parallel ranks do too: they hold the same averaged gradients.
    scaler.update    Megatron's loss-scale rule (rapidgpt/optim/grad_scaler.py)
    clip             by the global norm (--clip-grad)
    num zeros        --log-num-zeros-in-grad: the clipped gradients' elements equal to 0, each
                     counted once as the norm counts it (Megatron's count_zeros_fp32)
    update           unless found_inf: the inner optimizer (AdamW/SGD) steps the main parameters;
                     16-bit runs then copy them into the model's 16-bit parameters
    params norm      --log-params-norm: the L2 norm of the main parameters after the update (fp32
                     in every precision; each element counted once over the ranks holding them),
                     as Megatron's calc_params_l2_norm reads them

`wrapper(grads, lr) -> (updated, grad norm, loss scale, num zeros, params norm, held)`, traceable:
it runs inside the compiled step; num zeros and params norm are 0 unless `report` asked for them.
`wrapper(grads, lr, loss, validation)`: the rerun state machine's checks
(rapidgpt/training/rerun_state_machine.py) on the step's loss and gradient norm, `validation` =
`[loss limit, norm limit, hold non-finite, hold]` (float32 [4]); a step they reject is held: no
update and no loss-scale change (it is not an overflow), and `held` is True. Main parameters: in fp32 runs the model's own parameters; in 16-bit runs fp32 copies
(`main_params.<name>`) that the inner optimizer and its fp32 state (Adam's moments) belong to,
as in Megatron's Float16OptimizerWithFloat16Params. Model states per parameter are then 2 bytes
(16-bit weight) + 2 (16-bit gradient) + 4 (fp32 main weight) + 8 (fp32 Adam moments), the 16
bytes of the ZeRO paper; ZeRO stage 1 (rapidgpt/optim/distributed_optimizer.py) shards the last 12,
stage 2 also the gradients (the wrapper is then handed this rank's pieces of them), stage 3 the
weights too (rapidgpt/parallel/fully_sharded.py).

Checkpoints hold each model parameter's fp32 value (the main copy in 16-bit runs) under the
model parameter's name, and the optimizer state under the names an fp32 run gives it, so a
checkpoint does not depend on the precision it was trained in: fp16 and fp32 runs resume from
each other's checkpoints. The 16-bit weights are not saved: they are always the main weights
cast to 16 bits.
"""
from typing import NamedTuple

import mindspore as ms
from mindspore import Parameter, ParameterTuple, nn, ops

from rapidgpt.config.precision import PrecisionConfig
from rapidgpt.errors import UserError
from rapidgpt.optim.adamw import build_optimizer
from rapidgpt.optim.clip_grads import clip_grads_by_global_norm, count_zeros, global_grad_norm, params_norm
from rapidgpt.optim.grad_scaler import build_grad_scaler
from rapidgpt.parallel import comm
from rapidgpt.parallel.state import get_model_parallel_group, get_tensor_model_parallel_rank
from rapidgpt.emulated_bf16 import assign_rounded, round_to_bf16
from rapidgpt.tensor_tuples import assign_cast, map_tensors, times, to_fp32

MAIN_PARAMS_PREFIX = "main_params."


def checkpoint_name(name):
    """The name a wrapper's tensor has in checkpoints: an fp32 run's name for it."""
    return name.replace(MAIN_PARAMS_PREFIX, "", 1)


def rejected(loss, norm, validation):
    """Whether the rerun state machine's checks reject a step (graph scalars): `validation` =
    `[loss limit, norm limit, hold non-finite, hold]`; a finite loss (gradient norm) at or above its
    limit (+inf: none) is too large, as Megatron's is_unexpectedly_large; with `hold non-finite`
    a NaN/Inf loss or norm is rejected; `hold` rejects whatever the values."""
    def too_large(value, limit):
        return ops.logical_and(ops.isfinite(value), value >= limit)
    non_finite = ops.logical_not(ops.logical_and(ops.isfinite(loss), ops.isfinite(norm)))
    return ops.logical_or(ops.logical_or(validation[3] > 0, ops.logical_and(validation[2] > 0, non_finite)),
                          ops.logical_or(too_large(loss, validation[0]), too_large(norm, validation[1])))


class OptimizerWrapper(nn.Cell):
    """See the module docstring. `model_params`: the parameters the step differentiates (the
    model's trainable ones); `make_optimizer(main_params)`: the inner optimizer over the main
    parameters; `precision`: a rapidgpt.config.precision.PrecisionConfig; `clip_grad`: --clip-grad."""

    def __init__(self, model_params, make_optimizer, precision, clip_grad):
        super().__init__(auto_prefix=False)
        self.parameters = ParameterTuple(model_params)
        self.half = precision.half
        self.emulates_bf16 = precision.emulated_bf16     # the model's parameters: fp32 holding bf16 values
        self.gradient_layout = None         # whole gradients, one per parameter (ZeRO-2: a ShardPlan)
        self._build_main_params(make_optimizer)
        self.grad_scaler = build_grad_scaler(precision)
        self.clip_grad = clip_grad
        first = get_tensor_model_parallel_rank() == 0
        self.in_norm = tuple((first or getattr(p, "tensor_model_parallel", False))
                             and not getattr(p, "pipeline_shared_copy", False) for p in self.parameters)
        self.norm_sum_over_ranks = _sum_over(self._norm_group())
        self.counts_zeros = self.measures_params = False

    def report(self, num_zeros_in_grad=False, params_norm=False):
        """Also compute Megatron's --log-num-zeros-in-grad and --log-params-norm statistics in the
        step (before it is compiled)."""
        self.counts_zeros, self.measures_params = num_zeros_in_grad, params_norm
        if params_norm:
            if hasattr(self.optimizer, "update_mapped"):
                self.optimizer.update_mapped = False    # the norm reads the parameters after the update
            self.params_in_norm, group = self._params_norm_layout()
            self.params_sum_over_ranks = _sum_over(group)

    def _params_norm_layout(self):
        """(which main parameters this rank counts in the params norm, the group adding the ranks'
        sums of squares): as the gradients, which they correspond to one to one here."""
        return self.in_norm, self._norm_group()

    def _norm_group(self):
        """The ranks whose sums of squares make the global norm: the model-parallel group (TP x PP;
        the data-parallel ranks hold the same averaged gradients)."""
        return get_model_parallel_group()

    def _build_main_params(self, make_optimizer):
        """The parameters the inner optimizer steps (`main_params`) and the inner optimizer."""
        if self.half:
            self.main_params = ParameterTuple(
                Parameter(p.value().astype(ms.float32), name=MAIN_PARAMS_PREFIX + p.name, requires_grad=False)
                for p in self.parameters)
        else:
            self.main_params = self.parameters
        self.optimizer = make_optimizer(self.main_params)
        # fp32: the update is the last thing the step graph does with the parameters (16-bit runs
        # copy the main parameters into the model's after it; ZeRO-1/2 build their own main
        # parameters and gather them after it; ZeRO-3's pieces are gathered by the next step).
        if not self.half and hasattr(self.optimizer, "update_mapped"):
            self.optimizer.update_mapped = True

    @classmethod
    def around(cls, optimizer, clip_grad=0.0, precision=None):
        """The wrapper of an optimizer already built over the model's parameters: fp32 (the
        default), or 16-bit if `optimizer` has `with_parameters` (RapidGPT's AdamW and SGD)."""
        precision = precision or PrecisionConfig()
        make = optimizer.with_parameters if precision.half else (lambda main_params: optimizer)  # noqa: E731
        return cls(list(optimizer.parameters), make, precision, clip_grad)

    @property
    def learning_rate(self):
        return self.optimizer.learning_rate

    def loss_scale(self):
        """The current loss scale as a graph value (1.0 when the loss is not scaled)."""
        if self.grad_scaler is None:
            return ops.ones((), ms.float32)
        return self.grad_scaler.scale

    def construct(self, grads, lr, loss=None, validation=None):
        if self.half:
            grads = map_tensors(to_fp32, grads)
        if self.grad_scaler is not None:
            grads = map_tensors(ops.partial(times, 1.0 / self.grad_scaler.scale), grads)
        norm = global_grad_norm(grads, self.norm_sum_over_ranks, self.in_norm)
        # A NaN/Inf gradient makes the norm non-finite (as does a norm beyond fp32, which
        # clipping would turn into a zero update): one scalar test instead of a pass over grads.
        finite = ops.isfinite(norm)
        held = ops.zeros((), ms.bool_) if validation is None else rejected(loss, norm, validation)
        updated = ops.logical_and(finite, ops.logical_not(held))
        scale = self.loss_scale() if self.grad_scaler is None else \
            self.grad_scaler.update(ops.logical_not(finite), held)
        grads, norm = clip_grads_by_global_norm(grads, self.clip_grad, norm)
        if updated:
            self.step(grads, lr)
        # The statistics after the update (the zeros are those of the gradients it was handed): counted
        # before it, in the branch's first part of the graph, the zeros' all-reduce made MindSpore run
        # two all-reduces of the sequence-parallel backward on one TP group at once, which then
        # exchanged each other's data (a TP=2 run stopped in its first step; measured, MindSpore 2.10).
        zeros = ops.zeros((), ms.float32)
        if self.counts_zeros:
            zeros = count_zeros(grads, self.norm_sum_over_ranks, self.in_norm)
        norm_of_params = ops.zeros((), ms.float32)
        if self.measures_params:     # the graph orders a Parameter's reads after its writes
            norm_of_params = params_norm(self.main_params, self.params_sum_over_ranks, self.params_in_norm,
                                         after=zeros if self.counts_zeros else None)
        return updated, norm, scale, zeros, norm_of_params, held

    def step(self, grads, lr):
        done = self.optimizer(grads, lr)
        if self.half:
            done = ops.depend(done, self.assign_model_params(done, self.parameters, self.main_params))
        return done

    def assign_model_params(self, done, params, values):
        """`params` (the model's) = `values` (fp32) in the model's precision, once `done`."""
        if self.emulates_bf16:
            return map_tensors(ops.partial(assign_rounded, done), params, values)
        return map_tensors(ops.partial(assign_cast, done), params, values)

    def model_value(self, value, param):
        """A model parameter's value from its fp32 `value` (host side, after a load)."""
        return round_to_bf16(value) if self.emulates_bf16 else value.astype(param.dtype)

    def held_bytes(self):
        """(bytes of the model's parameters, bytes of the main parameters and optimizer state kept
        beside them) on this rank: what the memory estimate's weights and optimizer terms count
        (rapidgpt/theoretical_memory.py)."""
        model_ids = {id(p) for p in self.parameters}
        state = {id(p): p for p in list(self.main_params) + list(self.optimizer.get_parameters())
                 if id(p) not in model_ids}
        return sum(p.nbytes for p in self.parameters), sum(p.nbytes for p in state.values())

    def held_line(self):
        """The start-up log line of `held_bytes` (with the ZeRO stage when sharded)."""
        weights, state = self.held_bytes()
        return (f" > model states held on this rank: weights {weights} bytes, main parameters and optimizer "
                f"state {state} bytes{self.sharding_note()}")

    def sharding_note(self):
        """What the held-bytes line adds about sharding (nothing without ZeRO)."""
        return ""

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint_tensors(self, with_state):
        """{checkpoint name: Parameter} beside the model's own parameters: the fp32 main copy of each
        model parameter under its name (16-bit runs), and with `with_state` the inner optimizer's
        state and the loss scaler's (`grad_scaler.*`, optional when loading)."""
        tensors = {p.name: main for p, main in zip(self.parameters, self.main_params)} if self.half else {}
        if with_state:
            for p in self.optimizer.get_parameters():
                tensors.setdefault(checkpoint_name(p.name), p)
            if self.grad_scaler is not None:
                tensors.update({p.name: p for p in self.grad_scaler.get_parameters()})
        return tensors

    def optional_checkpoint_tensors(self):
        """Names a checkpoint may lack (the scaler's, when it was saved by an fp32 run): they keep
        their initial values."""
        return {p.name for p in self.grad_scaler.get_parameters()} if self.grad_scaler is not None else set()

    def reload_model_params(self):
        """After the main parameters were loaded: the model's 16-bit parameters from them."""
        if self.half:
            for model_param, main_param in zip(self.parameters, self.main_params):
                model_param.set_data(self.model_value(main_param.value(), model_param))


def _sum_over(group):
    """The AllReduce-SUM cell over `group`, or None when it is this rank alone."""
    return comm.AllReduce(group) if comm.group_size(group) > 1 else None


class OptimizerRebuildError(UserError, TypeError):
    """A user's optimizer cannot be rebuilt over fp32 main parameters; the message says what to return."""


def wrap_optimizer(optimizer, model, args, zero3_units=()):
    """The OptimizerWrapper of a run: over `optimizer` (a user's, or None: built from the optimizer
    flags over the model's trainable parameters) with `args.precision` and --clip-grad. Under
    ZeRO-3, `zero3_units` are the model's sharded layers' ShardedWeights, as prepare_model
    (rapidgpt/training/model_transforms.py) returned them.

    In 16-bit runs the inner optimizer must be built over the fp32 main parameters, so a user's
    optimizer is rebuilt over them with `optimizer.with_parameters` (RapidGPT's AdamW and SGD have it).
    """
    wrapper = _wrapper(optimizer, model, args, zero3_units)
    wrapper.report(getattr(args, "log_num_zeros_in_grad", False), getattr(args, "log_params_norm", False))
    return wrapper


def _wrapper(optimizer, model, args, zero3_units):
    precision = args.precision
    zero = getattr(args, "zero", None)
    if zero is not None and zero.stage >= 1:
        return _sharded_wrapper(optimizer, model, args, zero3_units)
    if optimizer is None:
        return OptimizerWrapper(model.trainable_params(), lambda main_params: build_optimizer(args, main_params),
                                precision, args.clip_grad)
    if precision.half and not hasattr(optimizer, "with_parameters"):
        raise OptimizerRebuildError(f"--{'fp16' if precision.params_dtype == 'float16' else 'bf16'}: the "
                        f"{type(optimizer).__name__} from model_optimizer_lr_scheduler_provider cannot be "
                        f"rebuilt over fp32 main parameters; return rapidgpt.optim.AdamW/SGD, or None to "
                        f"build one from the flags")
    return OptimizerWrapper.around(optimizer, args.clip_grad, precision)


def _sharded_wrapper(optimizer, model, args, units):
    """ZeRO: the inner optimizer (the flags', or the user's rebuilt) over this rank's pieces of the
    main parameters (rapidgpt/optim/distributed_optimizer.py), each piece in the groups (weight
    decay, rate, eps) of the parameter it is cut from. Stages 1 and 2 cut them from the model's
    whole parameters; at stage 3 the model already holds only its pieces (`units`,
    rapidgpt/parallel/fully_sharded.py), of which the parameters' names and ranks are what the
    group rules read."""
    from rapidgpt.optim.distributed_optimizer import DistributedOptimizerWrapper, FullyShardedOptimizerWrapper
    make = _piece_optimizer(optimizer, args)
    if args.zero.stage == 3:
        owners = [_Owner(u.names[i], u.ndims[i]) for u in units for i, _, _ in u.plan.pieces]
        _check_updates_all(optimizer, owners, args)
        return FullyShardedOptimizerWrapper(units, lambda main: make(main, owners), args.precision, args.clip_grad)
    owners = model.trainable_params() if optimizer is None else list(optimizer.parameters)
    _check_updates_all(optimizer, owners, args)
    return DistributedOptimizerWrapper(owners, make, args.precision, args.clip_grad,
                                       shard_gradients=args.zero.stage >= 2)


def _piece_optimizer(optimizer, args):
    """`make(pieces, owners)` -> the inner optimizer over pieces, each in its owner's groups: the
    flags' optimizer, or the user's `optimizer` rebuilt."""
    if optimizer is not None and not hasattr(optimizer, "with_parameters"):
        raise OptimizerRebuildError(
            f"{args.zero.flag}: the {type(optimizer).__name__} from model_optimizer_lr_scheduler_provider cannot "
            f"be rebuilt over this rank's shard of the parameters; return rapidgpt.optim.AdamW/SGD, or None to "
            f"build one from the flags")

    def make(pieces, owners):
        inner = build_optimizer(args, pieces, owners) if optimizer is None else optimizer.with_parameters(pieces, owners)
        inner.assign_before_update = True
        return inner
    return make


def _check_updates_all(optimizer, owners, args):
    """A user's optimizer must update every trainable parameter ZeRO shards."""
    if optimizer is None:
        return
    updated = {p.name for p in optimizer.parameters}
    missing = [o.name for o in owners if o.name not in updated]
    if missing:
        raise OptimizerRebuildError(f"{args.zero.flag}: the optimizer from model_optimizer_lr_scheduler_provider does "
                                    f"not update {missing[0]}, a trainable parameter of the model; build it over "
                                    f"model.trainable_params()")


class _Owner(NamedTuple):
    """What the group rules (weight decay, rate, eps) read of a parameter ZeRO-3 has cut into pieces."""
    name: str
    ndim: int
