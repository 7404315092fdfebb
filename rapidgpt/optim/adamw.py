"""Optimizers with PyTorch/Megatron semantics: AdamW (bias-corrected) and SGD.

Both take the learning rate as a Tensor argument, `opt(grads, lr)`, so the engine's jitted step
compiles once while the schedule changes the rate every iteration (a Python float argument to
a jitted function recompiles per value). The value is kept in the `learning_rate` Parameter,
which is saved with the optimizer state.

Weight decay follows Megatron's parameter groups: biases and 1-D parameters (LayerNorm/RMSNorm
weights and biases) get none (with --apply-wd-to-qk-layernorm the q/k norms' do); pass
`no_decay_filter` to choose differently.

Learning-rate groups: the rate is a Tensor of one rate per group, in the order the scheduler's
`get_lrs()` gives them (rapidgpt/optim/lr_scheduler.py): --lr; with `decoupled_lr=True`
(--decoupled-lr) the input embedding's and the output layer's (`megatron_decoupled_lr`); with
`mup_width_mult` != 1 (--use-mup, rapidgpt/config/mup.py) muP's scaled class (`mup_vector_like`:
Adam's hidden matrices, SGD's vector-like parameters), whose Adam eps is divided by the multiplier
too. A parameter's groups (decay, rate, eps) are read from its `owner`: itself, or under --fp16 and
ZeRO the model parameter that a main copy or a piece stands for (`with_parameters`).
"""
import mindspore as ms
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from rapidgpt.tensor_tuples import map_tensors


def megatron_no_decay(param):
    """Megatron's rule (get_param_groups): no weight decay for biases and 1-D parameters.

    Norm weights and biases are 1-D, so this covers them without matching on names (substring
    rules like "ln" catch unrelated parameter names).
    """
    return param.name.endswith("bias") or param.ndim <= 1


def megatron_no_decay_but_qk_norms(param):
    """--apply-wd-to-qk-layernorm (Megatron's rule for Qwen3-Next): megatron_no_decay, except that
    the q/k norms' weights (and a LayerNorm's biases there) decay."""
    return megatron_no_decay(param) and not ("q_layernorm." in param.name or "k_layernorm." in param.name)


def megatron_decoupled_lr(param):
    """Megatron's rule (is_embedding_or_output_parameter): the word embedding and the output layer's
    weight take --decoupled-lr. By name, so that it holds for their fp32 main copies and ZeRO's
    pieces too, which keep the name as a suffix."""
    return param.name.endswith(DECOUPLED_LR_NAMES)


DECOUPLED_LR_NAMES = ("word_embeddings.weight", "output_layer.weight")
# The embeddings and the output layer: vector-like for muP (Megatron's is_embedding_parameter).
MUP_EMBEDDING_NAMES = DECOUPLED_LR_NAMES + ("position_embeddings.weight",)


def mup_vector_like(param):
    """muP's vector-like parameters (Megatron's is_vector_like_parameter): the embeddings, the output
    layer and every 1-D parameter (norms, biases); every other parameter is a hidden matrix."""
    return param.ndim <= 1 or param.name.endswith(MUP_EMBEDDING_NAMES)


def weight_decays_of(params, weight_decay, no_decay_filter=None):
    """Each parameter's weight decay: `weight_decay`, or 0 where `no_decay_filter` (default
    megatron_no_decay) says so."""
    no_decay = no_decay_filter or megatron_no_decay
    return tuple(0.0 if no_decay(p) else float(weight_decay) for p in params)


class _Optimizer(nn.Cell):
    """What AdamW and SGD share: the parameter tuple, each parameter's groups (weight decay, rate,
    eps multiplier) read from `owners` (default the parameters themselves), the lr Parameter."""

    def __init__(self, params, lr, weight_decay, no_decay_filter, decoupled_lr=False, mup_width_mult=1.0,
                 owners=None):
        # auto_prefix=False: registering the state must not rename the model's parameters.
        super().__init__(auto_prefix=False)
        self.parameters = ParameterTuple(params)
        if not self.parameters:
            raise ValueError(f"{type(self).__name__} got no parameters to optimize")
        names = [p.name for p in self.parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            # Same-named state Parameters would break ms.jit and checkpoints later, obscurely.
            raise ValueError(f"parameter names must be unique, repeated: {duplicates}")
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"--lr ({lr}) and --weight-decay ({weight_decay}) must be >= 0")
        owners = self.parameters if owners is None else tuple(owners)
        if len(owners) != len(self.parameters):
            raise ValueError(f"{len(owners)} owners for {len(self.parameters)} parameters")
        # Python floats and ints: constants folded into the compiled graph.
        self.weight_decays = weight_decays_of(owners, weight_decay, no_decay_filter)
        self.mup_width_mult = float(mup_width_mult)
        mup_slot = 1 + int(decoupled_lr) if self.mup_width_mult != 1.0 else None
        rates = 1 + int(decoupled_lr) + int(mup_slot is not None)
        self.learning_rate = Parameter(Tensor([lr] * rates if rates > 1 else lr, ms.float32), name="learning_rate",
                                       requires_grad=False)
        # Each parameter's index into the rate (Python constants), or None: one rate for all.
        self.lr_slots = None if rates == 1 else tuple(
            1 if decoupled_lr and megatron_decoupled_lr(o) else mup_slot if self._mup_lr_scaled(o) else 0
            for o in owners)
        self.mup_eps = tuple(self._mup_eps_scaled(o) for o in owners)     # eps / width multiplier
        # Set under ZeRO (rapidgpt/optim/mixed_precision.py), whose wrapper reads the pieces right
        # after the update to gather them: every parameter is then written by an assign before its
        # update kernel (p *= 1 - lr*wd, exact at wd = 0). MindSpore 2.10 does not reliably order
        # a read of a Parameter after an in-place kernel (Adam, ApplyMomentum) alone: at commit
        # c3aa45a ZeRO-1 with --weight-decay 0 gathered the previous step's pieces (measured),
        # and a preceding assign ordered them. Cost: one pass over the undecayed pieces per step.
        self.assign_before_update = False
        # Set by the optimizer wrapper when nothing in its graph reads the parameters after the
        # update (fp32 without ZeRO): AdamW then maps its update over the parameters
        # (rapidgpt.tensor_tuples.map_tensors) instead of unrolling a loop: the same kernels, about
        # 0.5 s less of the bench model's first compile (benchmarks/bench_pretrain.py, 2026-11-28).
        # Not otherwise: a mapped update is not ordered before later reads (rapidgpt/tensor_tuples.py).
        self.update_mapped = False

    def _mup_lr_scaled(self, owner):
        """Whether muP scales `owner`'s rate (the class each optimizer scales; none without muP)."""
        return False

    def _mup_eps_scaled(self, owner):
        """Whether muP divides `owner`'s eps by the width multiplier."""
        return False

    def with_parameters(self, params, owners=None):
        """This optimizer (its hyper-parameters) over `params`, each in the groups of the parameter
        of `owners` it stands for: by default `self.parameters`, one to one (their fp32 main copies
        under --fp16); under ZeRO each piece's model parameter."""
        if owners is None and len(params) != len(self.parameters):
            raise ValueError(f"with_parameters: {len(params)} parameters for an optimizer of {len(self.parameters)}")
        return type(self)(params, owners=self.parameters if owners is None else owners, **self.hyperparameters)

    def _update_lr(self, lr):
        """Store `lr` (a Tensor, or None to keep the current rate) and return the rate to use."""
        if lr is not None:
            ops.assign(self.learning_rate, ops.cast(lr, ms.float32))
        return self.learning_rate

    def _rate(self, lr, i):
        """The rate of parameter i: `lr`, or its element for the parameter's group."""
        return lr if self.lr_slots is None else lr[self.lr_slots[i]]


class AdamW(_Optimizer):
    """torch.optim.AdamW on MindSpore's fused Adam kernel (`ops.Adam`, the one `nn.Adam` uses).

    torch.optim.AdamW, at step t with bc1 = 1 - b1^t, bc2 = 1 - b2^t:
        p *= 1 - lr*wd                                  (decoupled weight decay, first)
        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
        p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    `ops.Adam(var, m, v, b1^t, b2^t, lr, b1, b2, eps', g)` does the last two lines as
    `p -= lr*sqrt(bc2)/bc1 * m / (sqrt(v) + eps')`; with eps' = eps*sqrt(bc2) that is exactly
    torch's update (multiply numerator and denominator by sqrt(bc2)). The decay is its own
    `assign` before the kernel, only on decayed parameters. Measured in the compiled step this is
    ~20 ms/step faster than `ops.AdamWeightDecay` with the correction folded into its lr.

    State: `exp_avg` ("adam_m.*"), `exp_avg_sq` ("adam_v.*"), `step_count` ("adam_step"),
    `learning_rate`.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, no_decay_filter=None,
                 decoupled_lr=False, mup_width_mult=1.0, owners=None):
        super().__init__(params, lr, weight_decay, no_decay_filter, decoupled_lr, mup_width_mult, owners)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps <= 0:
            raise ValueError(f"AdamW needs 0 <= --adam-beta1, --adam-beta2 < 1 and --adam-eps > 0, "
                             f"got betas={betas}, eps={eps}")
        self.hyperparameters = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                    no_decay_filter=no_decay_filter, decoupled_lr=decoupled_lr,
                                    mup_width_mult=mup_width_mult)
        self.beta1 = Tensor(betas[0], ms.float32)
        self.beta2 = Tensor(betas[1], ms.float32)
        self.eps = Tensor(eps, ms.float32)
        param_tuple = ParameterTuple(self.parameters)
        self.exp_avg = param_tuple.clone(prefix="adam_m", init="zeros")
        self.exp_avg_sq = param_tuple.clone(prefix="adam_v", init="zeros")
        self.step_count = Parameter(Tensor(0, ms.int32), name="adam_step", requires_grad=False)

    def construct(self, grads, lr=None):
        """One step; `grads` in `self.parameters` order, `lr` an optional Tensor (a scalar, or one rate
        per group: module docstring). Returns lr."""
        lr = self._update_lr(lr)
        ops.assign_add(self.step_count, ops.ones((), ms.int32))
        t = ops.cast(self.step_count, ms.float32)
        beta1_power, beta2_power = ops.pow(self.beta1, t), ops.pow(self.beta2, t)
        eps = self.eps * ops.sqrt(1 - beta2_power)
        mup_eps = eps / self.mup_width_mult if self.mup_width_mult != 1.0 else eps
        if self.update_mapped and self.lr_slots is None and self.mup_width_mult == 1.0:
            done = map_tensors(ops.partial(_adamw_update, beta1_power, beta2_power, lr, self.beta1, self.beta2, eps),
                               self.parameters, self.exp_avg, self.exp_avg_sq, grads, self.weight_decays)
            return ops.depend(lr, done)
        for i, (p, m, v, g, wd) in enumerate(zip(self.parameters, self.exp_avg, self.exp_avg_sq, grads,
                                                  self.weight_decays)):
            rate = self._rate(lr, i)
            if wd > 0 or self.assign_before_update:          # Python constants: no branch in the graph
                p = ops.depend(p, ops.assign(p, p * (1 - rate * wd)))
            _ADAM(p, m, v, beta1_power, beta2_power, rate, self.beta1, self.beta2, mup_eps if self.mup_eps[i] else eps,
                  ops.cast(g, p.dtype))
        return lr

    def _mup_lr_scaled(self, owner):
        """muP for Adam: the hidden matrices take lr / m, and eps / m."""
        return self.mup_width_mult != 1.0 and not mup_vector_like(owner)

    _mup_eps_scaled = _mup_lr_scaled


_ADAM = ops.Adam()


def _adamw_update(beta1_power, beta2_power, lr, beta1, beta2, eps, p, m, v, g, wd):
    """AdamW's update of one parameter, `wd` its weight decay (a Python constant), for map_tensors."""
    if wd > 0:
        p = ops.depend(p, ops.assign(p, p * (1 - lr * wd)))
    return _ADAM(p, m, v, beta1_power, beta2_power, lr, beta1, beta2, eps, ops.cast(g, p.dtype))


class SGD(_Optimizer):
    """torch.optim.SGD: coupled L2 decay, heavy-ball momentum (no dampening, no Nesterov).

        d_p = g + wd*p;  buf = momentum*buf + d_p (buf = d_p at the first step);  p -= lr*buf
    `ops.ApplyMomentum` does exactly the last two on a zero-initialised buffer (0*momentum + d_p
    = d_p at the first step). Without momentum no buffer is kept.
    """

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0, no_decay_filter=None, decoupled_lr=False,
                 mup_width_mult=1.0, owners=None):
        super().__init__(params, lr, weight_decay, no_decay_filter, decoupled_lr, mup_width_mult, owners)
        if momentum < 0:
            raise ValueError(f"--sgd-momentum must be >= 0, got {momentum}")
        self.momentum = float(momentum)
        self.hyperparameters = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                    no_decay_filter=no_decay_filter, decoupled_lr=decoupled_lr,
                                    mup_width_mult=mup_width_mult)
        if self.momentum > 0:
            self.momentum_buffers = ParameterTuple(self.parameters).clone(prefix="sgd_momentum", init="zeros")
            self.apply_momentum = ops.ApplyMomentum()

    def construct(self, grads, lr=None):
        """One step; `grads` in `self.parameters` order, `lr` an optional Tensor (a scalar, or one rate
        per group: module docstring). Returns lr."""
        lr = self._update_lr(lr)
        for i, p in enumerate(self.parameters):
            rate = self._rate(lr, i)
            d_p = ops.cast(grads[i], p.dtype)
            if self.weight_decays[i] > 0:
                d_p = d_p + self.weight_decays[i] * p
            if self.momentum > 0:
                if self.assign_before_update:
                    p = ops.depend(p, ops.assign(p, p * 1))
                self.apply_momentum(p, self.momentum_buffers[i], ops.cast(rate, p.dtype), d_p, self.momentum)
            else:
                ops.assign_sub(p, ops.cast(rate, p.dtype) * d_p)
        return lr

    def _mup_lr_scaled(self, owner):
        """muP for SGD: the vector-like parameters take lr x m."""
        return self.mup_width_mult != 1.0 and mup_vector_like(owner)


def build_optimizer(args, params, owners=None):
    """The optimizer named by `--optimizer` ("adam" = AdamW, or "sgd"), with Megatron's defaults;
    `owners`: the parameters whose groups `params` take (see the module docstring)."""
    name = getattr(args, "optimizer", "adam")
    no_decay = megatron_no_decay_but_qk_norms if getattr(args, "apply_wd_to_qk_layernorm", False) else None
    groups = dict(weight_decay=getattr(args, "weight_decay", 0.01), no_decay_filter=no_decay,
                  decoupled_lr=getattr(args, "decoupled_lr", None) is not None,
                  mup_width_mult=args.mup.width_mult if getattr(args, "mup", None) else 1.0, owners=owners)
    if name == "adam":
        betas = (getattr(args, "adam_beta1", 0.9), getattr(args, "adam_beta2", 0.999))
        return AdamW(params, lr=args.lr, betas=betas, eps=getattr(args, "adam_eps", 1e-8), **groups)
    if name == "sgd":
        return SGD(params, lr=args.lr, momentum=getattr(args, "sgd_momentum", 0.9), **groups)
    raise ValueError(f"--optimizer: unknown optimizer {name!r}; choose 'adam' or 'sgd'")
