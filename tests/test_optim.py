"""rapidgpt.optim against independent numpy/Python versions of Megatron's and PyTorch's formulas."""
import math
from argparse import Namespace

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor
from mindspore.graph.api import ms_compile_cache  # MindSpore-internal: phases of the compiled graphs

from rapidgpt.optim import (SGD, AdamW, OptimizerParamScheduler, build_lr_scheduler, build_optimizer,
                            clip_grads_by_global_norm, global_grad_norm, megatron_no_decay)

ms.set_device("CPU")


# ----------------------------------------------------------------------------- learning rate

def megatron_lr(n, max_lr, min_lr, warmup, decay, style, init_lr=0.0, wsd_steps=None, wsd_style=None):
    """Megatron's OptimizerParamScheduler.get_lr, restated."""
    if warmup > 0 and n <= warmup:
        return init_lr + (max_lr - init_lr) * n / warmup
    if style == "constant":
        return max_lr
    if n > decay:
        return min_lr
    if style == "inverse-square-root":
        return max(min_lr, max_lr * max(warmup, 1) ** 0.5 / max(n, 1) ** 0.5)
    ratio = (n - warmup) / (decay - warmup)
    if style == "WSD":
        anneal_start = decay - wsd_steps
        if n <= anneal_start:
            coeff = 1.0
        else:
            r = (n - anneal_start) / wsd_steps
            coeff = {"linear": 1.0 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
                     "exponential": (2.0 * math.pow(0.5, r)) - 1.0, "minus_sqrt": 1.0 - math.sqrt(r)}[wsd_style]
        return min_lr + coeff * (max_lr - min_lr)
    coeff = {"linear": 1 - ratio, "cosine": 0.5 * (math.cos(math.pi * ratio) + 1)}[style]
    return min_lr + coeff * (max_lr - min_lr)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "inverse-square-root"])
@pytest.mark.parametrize("warmup,init_lr", [(0, 0.0), (64, 0.0), (64, 1e-4)])
def test_lr_schedule_matches_megatron(style, warmup, init_lr):
    sched = OptimizerParamScheduler(3e-4, 3e-5, warmup, 800, style, init_lr=init_lr)
    assert sched.get_lr() == pytest.approx(megatron_lr(0, 3e-4, 3e-5, warmup, 800, style, init_lr))
    n = 0
    for increment in [1, 7, 56, 1, 100, 336, 199, 1, 1, 400]:  # crosses warmup end, decay end, beyond
        lr = sched.step(increment)
        n += increment
        assert sched.num_steps == n
        assert lr == sched.get_lr() == pytest.approx(megatron_lr(n, 3e-4, 3e-5, warmup, 800, style, init_lr),
                                                     rel=1e-12)
    if style != "constant":
        assert sched.get_lr() == 3e-5  # past the decay end


@pytest.mark.parametrize("style", ["linear", "cosine", "inverse-square-root"])
def test_decoupled_lr_follows_megatrons_rule_per_group(style):
    """--decoupled-lr 5e-4 --decoupled-min-lr 4.5e-5 beside --lr 1.5e-4 --min-lr 1e-5 (Megatron's
    llama3 example; the ratios differ, so the second rate is not a multiple of the first): each
    group's curve is Megatron's rule with its own max and min, from the same --lr-warmup-init;
    --decoupled-min-lr defaults to --min-lr; the setting is in the state checked on resume."""
    sched = OptimizerParamScheduler(1.5e-4, 1e-5, 64, 800, style, init_lr=1e-6, decoupled_lr=5e-4,
                                    decoupled_min_lr=4.5e-5)
    n = 0
    for increment in [0, 1, 63, 5, 300, 400, 100]:
        sched.step(increment)
        n += increment
        assert sched.get_lrs() == pytest.approx((megatron_lr(n, 1.5e-4, 1e-5, 64, 800, style, 1e-6),
                                                 megatron_lr(n, 5e-4, 4.5e-5, 64, 800, style, 1e-6)), rel=1e-12)
    assert OptimizerParamScheduler(1.5e-4, 1e-5, 0, 800, style, decoupled_lr=5e-4).decoupled_min_lr == 1e-5
    assert OptimizerParamScheduler(1.5e-4, 1e-5, 0, 800, style).get_lrs() == (1.5e-4,)
    plain = OptimizerParamScheduler(1.5e-4, 1e-5, 64, 800, style, init_lr=1e-6)
    with pytest.raises(ValueError, match="--decoupled-lr: this run None, checkpoint 0.0005"):
        plain.load_state_dict(sched.state_dict())


@pytest.mark.parametrize("wsd_style", ["exponential", "linear", "cosine", "minus_sqrt"])
def test_wsd_schedule_matches_megatron(wsd_style):
    """--lr-decay-style WSD: warmup, --lr until the last --lr-wsd-decay-iters of the decay, then
    Megatron's annealing shape down to --min-lr (and --min-lr past the decay); from the flags,
    iteration-based (x --global-batch-size) and sample-based."""
    from rapidgpt.arguments import parse_args
    for length in (["--train-iters", "100", "--lr-warmup-iters", "10", "--lr-wsd-decay-iters", "30"],
                   ["--train-samples", "800", "--lr-warmup-samples", "80", "--lr-wsd-decay-samples", "240"]):
        args = parse_args(argv=["--lr", "3e-4", "--min-lr", "3e-5", "--global-batch-size", "8", "--lr-decay-style",
                                "WSD", "--lr-wsd-decay-style", wsd_style, *length])
        sched = build_lr_scheduler(args)
        assert (sched.wsd_decay_steps, sched.lr_decay_steps, sched.lr_warmup_steps) == (240, 800, 80)
        n = 0
        for increment in [0, 8, 72, 8, 400, 80, 8, 56, 64, 48, 8, 40, 8, 16]:   # warmup, stable, annealing, past
            sched.step(increment)
            n += increment
            assert sched.get_lr() == pytest.approx(
                megatron_lr(n, 3e-4, 3e-5, 80, 800, "WSD", 0.0, 240, wsd_style), rel=1e-12), n
        assert sched.state_dict()["lr_wsd_decay_style"] == wsd_style


@pytest.mark.parametrize("argv, message", [
    (["--lr-decay-style", "WSD"], "--lr-decay-style WSD: give the annealing's length as --lr-wsd-decay-iters "
                                  "(the unit of --train-iters)"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "8"],
     "--lr-decay-style WSD: give the annealing's length as --lr-wsd-decay-iters (the unit of --train-iters), not "
     "--lr-wsd-decay-samples"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "200"],
     "--lr-wsd-decay-iters: 200 must be in [1, the decay length 100]"),
    (["--lr-wsd-decay-iters", "20", "--lr-wsd-decay-style", "cosine"],
     "--lr-wsd-decay-iters, --lr-wsd-decay-style: the WSD schedule's settings; add --lr-decay-style WSD"),
])
def test_wsd_flags_are_checked_with_one_line_each(argv, message):
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(["--train-iters", "100", *argv]))
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_lr_schedule_landmarks():
    sched = OptimizerParamScheduler(1.0, 0.1, 10, 110, "linear")
    assert [sched.step(s) for s in (5, 5, 50, 50, 1)] == pytest.approx([0.5, 1.0, 0.55, 0.1, 0.1])
    cos = OptimizerParamScheduler(1.0, 0.0, 0, 100, "cosine")
    assert cos.step(50) == pytest.approx(0.5)


@pytest.mark.parametrize("kwargs,flag", [
    (dict(min_lr=2e-3), "--min-lr"),
    (dict(lr_warmup_steps=-1), "--lr-warmup-iters"),
    (dict(lr_warmup_steps=900), "must not exceed the decay length"),
    (dict(lr_decay_steps=0), "--lr-decay-iters"),
    (dict(lr_decay_style="exponential"), "--lr-decay-style"),
])
def test_lr_schedule_validation(kwargs, flag):
    settings = dict(max_lr=1e-3, min_lr=1e-5, lr_warmup_steps=10, lr_decay_steps=800, lr_decay_style="cosine")
    with pytest.raises(ValueError, match=flag):
        OptimizerParamScheduler(**{**settings, **kwargs})


def test_lr_state_dict_round_trip_and_mismatch():
    sched = OptimizerParamScheduler(1e-3, 1e-5, 80, 800, "cosine")
    sched.step(123)
    restored = OptimizerParamScheduler(1e-3, 1e-5, 80, 800, "cosine")
    restored.load_state_dict(sched.state_dict())
    assert restored.num_steps == 123 and restored.get_lr() == sched.get_lr()
    other = OptimizerParamScheduler(1e-3, 1e-5, 80, 1600, "cosine")
    with pytest.raises(ValueError, match=r"decay length in samples \(--lr-decay-iters, .*\): this run 1600, "
                                         r"checkpoint 800.*--override-opt_param-scheduler.*"
                                         r"--use-checkpoint-opt_param-scheduler"):
        other.load_state_dict(sched.state_dict())
    other.load_state_dict(sched.state_dict(), use_checkpoint=True)
    assert other.lr_decay_steps == 800 and other.get_lr() == sched.get_lr()


def megatron_args(**overrides):
    args = dict(lr=1e-3, min_lr=1e-5, lr_decay_style="cosine", train_iters=100, lr_decay_iters=None,
                lr_warmup_iters=10, lr_warmup_fraction=None, global_batch_size=8)
    return Namespace(**{**args, **overrides})


def test_build_lr_scheduler_iterations_in_samples():
    sched = build_lr_scheduler(megatron_args())
    assert (sched.lr_decay_steps, sched.lr_warmup_steps, sched.lr_decay_style) == (800, 80, "cosine")
    assert (sched.max_lr, sched.min_lr) == (1e-3, 1e-5)
    sched = build_lr_scheduler(megatron_args(lr_decay_iters=50, lr_warmup_iters=0, lr_warmup_fraction=0.1))
    assert (sched.lr_decay_steps, sched.lr_warmup_steps) == (400, 40)
    # The engine fills train_iters from --train-samples too; samples must still win.
    sched = build_lr_scheduler(megatron_args(train_samples=640, lr_decay_samples=480, lr_warmup_samples=48))
    assert (sched.lr_decay_steps, sched.lr_warmup_steps) == (480, 48)
    # Minimal namespace: Megatron's defaults (linear, min_lr 0, no warmup) for what is absent.
    sched = build_lr_scheduler(Namespace(lr=2e-4, train_iters=10, global_batch_size=2))
    assert (sched.lr_decay_style, sched.min_lr, sched.lr_warmup_steps, sched.lr_decay_steps) == ("linear", 0, 0, 20)


def test_build_lr_scheduler_samples():
    args = megatron_args(train_iters=None, train_samples=1000, lr_warmup_samples=50)
    sched = build_lr_scheduler(args)
    assert (sched.lr_decay_steps, sched.lr_warmup_steps) == (1000, 50)
    args = megatron_args(train_iters=None, train_samples=1000, lr_decay_samples=600, lr_warmup_fraction=0.25)
    sched = build_lr_scheduler(args)
    assert (sched.lr_decay_steps, sched.lr_warmup_steps) == (600, 150)


@pytest.mark.parametrize("overrides,message", [
    (dict(lr_warmup_fraction=0.1), "--lr-warmup-fraction and --lr-warmup-iters"),
    (dict(train_iters=None, train_samples=100, lr_warmup_samples=5, lr_warmup_fraction=0.1),
     "--lr-warmup-fraction and --lr-warmup-samples"),
    (dict(lr_warmup_iters=0, lr_warmup_fraction=1.5), "--lr-warmup-fraction: must lie"),
    (dict(train_iters=None), "--train-iters or --train-samples"),
    (dict(min_lr=1.0), "--min-lr"),
    (dict(lr_warmup_iters=200), r"--lr-warmup-iters: the warmup \(200 iterations\) is longer than the decay"),
])
def test_build_lr_scheduler_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_lr_scheduler(megatron_args(**overrides))


# ----------------------------------------------------------------------------- optimizers

def make_params():
    rng = np.random.default_rng(0)
    return [Parameter(Tensor(rng.standard_normal((4, 3)).astype(np.float32)), name="layer.weight"),
            Parameter(Tensor(rng.standard_normal(3).astype(np.float32)), name="layer.bias"),
            Parameter(Tensor(rng.standard_normal((5, 2)).astype(np.float32)), name="embedding.weight")]


def exclude_embedding(param):
    return megatron_no_decay(param) or param.name.startswith("embedding")


LRS = [1e-2, 2e-2, 0.0, 1.5e-2, 3e-2]  # lr changes every step; 0 is the first warmup step in practice


def step_grads(num_params_shapes):
    rng = np.random.default_rng(1)
    return [[rng.standard_normal(shape).astype(np.float32) for shape in num_params_shapes] for _ in LRS]


def numpy_adamw(params, grads_per_step, lrs, betas, eps, weight_decays):
    """torch.optim.AdamW (amsgrad=False), in float64."""
    p = [x.astype(np.float64) for x in params]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for i, g in enumerate(grads):
            p[i] = p[i] * (1 - lr * weight_decays[i])
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[i] / (1 - betas[0] ** t), v[i] / (1 - betas[1] ** t)
            p[i] = p[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def numpy_sgd(params, grads_per_step, lrs, momentum, weight_decays):
    """torch.optim.SGD (dampening 0, no Nesterov), in float64."""
    p = [x.astype(np.float64) for x in params]
    buf = [None] * len(p)
    for grads, lr in zip(grads_per_step, lrs):
        for i, g in enumerate(grads):
            d_p = g + weight_decays[i] * p[i]
            if momentum:
                buf[i] = d_p if buf[i] is None else momentum * buf[i] + d_p
                d_p = buf[i]
            p[i] = p[i] - lr * d_p
    return p


def run_steps(opt, grads_per_step, mode):
    """Apply the steps eagerly, in a jitted function, or as the engine does (under all_finite).

    The jitted step must compile once although lr changes every step (it is a Tensor argument).
    A tuple of Tensors passed to a jitted function is a compile-time constant (one graph per
    value) unless wrapped in `ms.mutable`; in the engine the grads come from inside the graph.
    """
    @ms.jit
    def jitted(grads, lr):
        opt(grads, lr)

    @ms.jit
    def jitted_if_finite(grads, lr):
        if ms.amp.all_finite(grads):
            opt(grads, lr)

    fn = {"pynative": opt, "jit": jitted, "jit_all_finite": jitted_if_finite}[mode]
    compiled_before = len(ms_compile_cache)
    for grads, lr in zip(grads_per_step, LRS):
        fn(ms.mutable(tuple(Tensor(g) for g in grads)), Tensor(lr, ms.float32))
    assert len(ms_compile_cache) - compiled_before == (mode != "pynative")


MODES = ["pynative", "jit", "jit_all_finite"]


@pytest.mark.parametrize("mode", MODES)
def test_adamw_matches_torch_adamw(mode):
    params = make_params()
    initial = [p.asnumpy().copy() for p in params]
    grads = step_grads([p.shape for p in params])
    betas, eps, wd = (0.9, 0.95), 1e-8, 0.1
    opt = AdamW(params, lr=0.5, betas=betas, eps=eps, weight_decay=wd, no_decay_filter=exclude_embedding)
    assert opt.weight_decays == (0.1, 0.0, 0.0)
    run_steps(opt, grads, mode)
    ref_p, ref_m, ref_v = numpy_adamw(initial, grads, LRS, betas, eps, [wd, 0.0, 0.0])
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.asnumpy(), ref_p[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(opt.exp_avg[i].asnumpy(), ref_m[i], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(opt.exp_avg_sq[i].asnumpy(), ref_v[i], rtol=1e-5, atol=1e-8)
    assert int(opt.step_count.asnumpy()) == len(LRS)
    assert float(opt.learning_rate.asnumpy()) == pytest.approx(LRS[-1])


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("mode", ["pynative", "jit"])
def test_decoupled_lr_updates_the_embedding_and_output_layer_at_their_rate(kind, mode):
    """decoupled_lr=True: the rate is a Tensor (lr, decoupled lr); parameters named
    *word_embeddings.weight and *output_layer.weight (also as fp32 main copies or ZeRO pieces,
    whose names end so) take the second, the others the first: the torch updates of each
    parameter at its own rate."""
    from rapidgpt.optim.adamw import megatron_decoupled_lr
    rng = np.random.default_rng(0)
    names = ["word_embeddings.weight", "layers.0.mlp.weight", "main_params.output_layer.weight", "final_norm.weight"]
    shapes = [(5, 3), (3, 3), (5, 3), (3,)]
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=n) for n, s in zip(names, shapes)]
    assert [megatron_decoupled_lr(p) for p in params] == [True, False, True, False]
    assert megatron_decoupled_lr(Parameter(Tensor(np.zeros(2, np.float32)), name="zero_shard.word_embeddings.weight"))
    initial = [p.asnumpy().copy() for p in params]
    grads = step_grads(shapes)
    rates = [(lr, 3 * lr + 1e-3) for lr in LRS]
    if kind == "adam":
        opt = AdamW(params, lr=0.5, betas=(0.9, 0.95), weight_decay=0.1, decoupled_lr=True)
    else:
        opt = SGD(params, lr=0.5, momentum=0.9, weight_decay=0.1, decoupled_lr=True)
    assert opt.lr_slots == (1, 0, 1, 0)
    @ms.jit
    def jitted(grads, lr):
        opt(grads, lr)

    fn = opt if mode == "pynative" else jitted
    for step, rate in zip(grads, rates):
        fn(ms.mutable(tuple(Tensor(g) for g in step)), Tensor(rate, ms.float32))
    for i, p in enumerate(params):
        own = [rate[opt.lr_slots[i]] for rate in rates]
        column = [[step[i]] for step in grads]
        decay = [opt.weight_decays[i]]
        expected = (numpy_adamw([initial[i]], column, own, (0.9, 0.95), 1e-8, decay)[0] if kind == "adam"
                    else numpy_sgd([initial[i]], column, own, 0.9, decay))[0]
        np.testing.assert_allclose(p.asnumpy(), expected, rtol=1e-5, atol=1e-6, err_msg=names[i])
    np.testing.assert_allclose(opt.learning_rate.asnumpy(), rates[-1], rtol=1e-6)


def megatron_mup_group(name, ndim, optimizer, width_mult, decoupled):
    """(the group's rate: "lr" or "decoupled", its multiplier, the eps multiplier) of a parameter:
    Megatron's get_mup_config_overrides (d98e8a6) restated. LanguageModule marks the embedding's
    parameters and the output layer's weight is_embedding_parameter; is_embedding_or_output_parameter
    marks the word embeddings and the output layer; vector-like = embedding or at most 1-D."""
    embedding_or_output = name.endswith(("word_embeddings.weight", "output_layer.weight"))
    vector_like = embedding_or_output or "embeddings." in name or ndim <= 1
    if decoupled and embedding_or_output:
        return "decoupled", 1.0, 1.0 if vector_like or optimizer == "sgd" else 1 / width_mult
    if optimizer == "sgd":
        return "lr", width_mult if vector_like else 1.0, 1.0
    return "lr", 1.0 if vector_like else 1 / width_mult, 1.0 if vector_like else 1 / width_mult


@pytest.mark.parametrize("decoupled", [False, True], ids=["", "decoupled"])
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_mup_scales_megatrons_parameter_classes_also_in_zero_pieces(kind, decoupled):
    """--use-mup at width multiplier 4 (rapidgpt/config/mup.py): each parameter's rate follows
    Megatron's rule for its class (Adam: hidden matrices lr / 4 and eps / 4; SGD: vector-like
    parameters lr x 4; --decoupled-lr's parameters keep it), each rate on its own curve from the
    scheduler (the same warmup start, max and min times the multiplier): the torch updates of each
    parameter at its rate and eps (0.3: large enough to matter). The same optimizer over flat 1-D pieces of the parameters
    (ZeRO's), given the parameters as their owners, updates every element alike."""
    rng = np.random.default_rng(0)
    names = ["word_embeddings.weight", "position_embeddings.weight", "layers.0.mlp.dense_h_to_4h.weight",
             "layers.0.input_layernorm.gamma", "output_layer.weight", "layers.0.mlp.dense_h_to_4h.bias"]
    shapes = [(5, 3), (4, 3), (3, 3), (3,), (5, 3), (3,)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = step_grads(shapes)
    sched = OptimizerParamScheduler(0.5, 0.05, 8, 40, "cosine", init_lr=0.01, decoupled_lr=0.3 if decoupled else None,
                                    mup_lr_mult=4.0 if kind == "sgd" else 0.25)
    rates = []
    for _ in LRS:
        rates.append(sched.get_lrs())
        sched.step(8)
    hyper = dict(lr=0.5, weight_decay=0.1, decoupled_lr=decoupled, mup_width_mult=4.0)
    results = []
    for pieces in (False, True):
        params = [Parameter(Tensor(v), name=n) for v, n in zip(values, names)]
        owners = params
        if pieces:
            params = [Parameter(Tensor(v.reshape(-1)), name="zero_shard." + n) for v, n in zip(values, names)]
        opt = (AdamW(params, betas=(0.9, 0.95), eps=0.3, owners=owners, **hyper) if kind == "adam"
               else SGD(params, momentum=0.9, owners=owners, **hyper))

        @ms.jit
        def jitted(grads, lr):
            opt(grads, lr)
        for step, rate in zip(grads, rates):
            jitted(ms.mutable(tuple(Tensor(g.reshape(p.shape)) for g, p in zip(step, params))),
                   Tensor(rate, ms.float32))
        results.append([p.asnumpy().reshape(v.shape) for p, v in zip(params, values)])
    for i, name in enumerate(names):
        group, mult, eps_mult = megatron_mup_group(name, len(shapes[i]), kind, 4.0, decoupled)
        n_steps = np.arange(len(LRS)) * 8
        if group == "decoupled":
            own = [rate[1] for rate in rates]
            expected_rates = [megatron_lr(n, 0.3, 0.05, 8, 40, "cosine", 0.01) for n in n_steps]
        else:
            own = [rate[[0, 2][mult != 1.0] if decoupled else [0, 1][mult != 1.0]] for rate in rates]
            expected_rates = [megatron_lr(n, 0.5 * mult, 0.05 * mult, 8, 40, "cosine", 0.01) for n in n_steps]
        assert own == pytest.approx(expected_rates, rel=1e-12), name
        decay = [0.0 if len(shapes[i]) == 1 else 0.1]
        column = [[step[i]] for step in grads]
        expected = (numpy_adamw([values[i]], column, own, (0.9, 0.95), 0.3 * eps_mult, decay)[0] if kind == "adam"
                    else numpy_sgd([values[i]], column, own, 0.9, decay))[0]
        np.testing.assert_allclose(results[0][i], expected, rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(results[1][i], results[0][i], err_msg=f"{name}: pieces")


def test_apply_wd_to_qk_layernorm_decays_the_qk_norms_too():
    """--apply-wd-to-qk-layernorm (or Megatron's deprecated --no-weight-decay-cond-type
    apply_wd_to_qk_layernorm, said in one line): Megatron's predicate (1-D or *.bias, and not a q/k
    layernorm's) decides, so the q/k norms' weights and biases decay, other norms and biases not;
    also for ZeRO's flat pieces, through their owners."""
    from rapidgpt.arguments import parse_args
    names = ["layers.0.self_attention.q_layernorm.gamma", "layers.0.self_attention.k_layernorm.beta",
             "layers.0.input_layernorm.gamma", "layers.0.mlp.dense_h_to_4h.bias", "layers.0.mlp.dense_h_to_4h.weight"]
    shapes = [(4,), (4,), (4,), (4,), (4, 4)]
    params = [Parameter(Tensor(np.zeros(s, np.float32)), name=n) for n, s in zip(names, shapes)]
    for argv in (["--apply-wd-to-qk-layernorm"], ["--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"]):
        args = parse_args(argv=["--train-iters", "1", "--lr", "1e-3", "--weight-decay", "0.1", *argv])
        assert args.apply_wd_to_qk_layernorm
        assert build_optimizer(args, params).weight_decays == (0.1, 0.1, 0.0, 0.0, 0.1)
        pieces = [Parameter(Tensor(np.zeros(int(np.prod(s)), np.float32)), name="zero_shard." + n)
                  for n, s in zip(names, shapes)]
        assert build_optimizer(args, pieces, owners=params).weight_decays == (0.1, 0.1, 0.0, 0.0, 0.1)
    assert args.megatron_flag_lines == [" > --no-weight-decay-cond-type apply_wd_to_qk_layernorm: accepted; "
                                        "Megatron's deprecated spelling of --apply-wd-to-qk-layernorm"]
    plain = parse_args(argv=["--train-iters", "1", "--lr", "1e-3", "--weight-decay", "0.1"])
    assert build_optimizer(plain, params).weight_decays == (0.0, 0.0, 0.0, 0.0, 0.1)



    params = make_params()
    opt = AdamW(params)
    assert [p.name for p in params] == ["layer.weight", "layer.bias", "embedding.weight"]  # not renamed
    assert opt.parameters == tuple(params)
    assert [p.name for p in opt.exp_avg] == ["adam_m.layer.weight", "adam_m.layer.bias", "adam_m.embedding.weight"]
    assert [p.name for p in opt.exp_avg_sq][0] == "adam_v.layer.weight"
    assert (opt.step_count.name, opt.learning_rate.name, opt.learning_rate.shape) == ("adam_step", "learning_rate", ())
    assert opt.weight_decays == (0.01, 0.0, 0.01)  # Megatron: only the bias / 1-D param is excluded


def test_optimizer_rejects_repeated_names():
    params = make_params()
    params[2].name = "layer.weight"
    with pytest.raises(ValueError, match="layer.weight"):
        SGD(params, lr=0.1)


def test_adamw_keeps_lr_when_none_given():
    params = make_params()
    initial = [p.asnumpy().copy() for p in params]
    grads = step_grads([p.shape for p in params])[:1]
    opt = AdamW(params, lr=1e-2, weight_decay=0.0)
    opt(tuple(Tensor(g) for g in grads[0]))
    ref_p, _, _ = numpy_adamw(initial, grads, [1e-2], (0.9, 0.999), 1e-8, [0.0] * 3)
    np.testing.assert_allclose(params[0].asnumpy(), ref_p[0], rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_torch_sgd(mode, momentum):
    params = make_params()
    initial = [p.asnumpy().copy() for p in params]
    grads = step_grads([p.shape for p in params])
    opt = SGD(params, lr=0.5, momentum=momentum, weight_decay=0.1)
    run_steps(opt, grads, mode)
    ref_p = numpy_sgd(initial, grads, LRS, momentum, [0.1, 0.0, 0.1])
    for i, p in enumerate(params):
        np.testing.assert_allclose(p.asnumpy(), ref_p[i], rtol=1e-5, atol=1e-6)


def test_build_optimizer():
    args = Namespace(optimizer="adam", lr=3e-4, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6, weight_decay=0.1)
    opt = build_optimizer(args, make_params())
    assert isinstance(opt, AdamW)
    assert float(opt.beta1.asnumpy()) == pytest.approx(0.8) and float(opt.beta2.asnumpy()) == pytest.approx(0.95)
    assert float(opt.eps.asnumpy()) == pytest.approx(1e-6)
    assert float(opt.learning_rate.asnumpy()) == pytest.approx(3e-4) and opt.weight_decays[0] == 0.1
    opt = build_optimizer(Namespace(optimizer="sgd", lr=0.1, sgd_momentum=0.5, weight_decay=0.0), make_params())
    assert isinstance(opt, SGD) and opt.momentum == 0.5 and opt.weight_decays == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="--optimizer"):
        build_optimizer(Namespace(optimizer="lamb", lr=0.1), make_params())


# ----------------------------------------------------------------------------- clipping

def clip_inputs():
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(4, 3), (3,), (7, 5)]]
    return grads, float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))


@pytest.mark.parametrize("jit", [False, True])
def test_clip_grads(jit):
    grads, norm = clip_inputs()
    tensors = ms.mutable(tuple(Tensor(g) for g in grads))
    clip = ms.jit(clip_grads_by_global_norm) if jit else clip_grads_by_global_norm
    norm_fn = ms.jit(global_grad_norm) if jit else global_grad_norm
    assert float(norm_fn(tensors).asnumpy()) == pytest.approx(norm, rel=1e-6)

    clipped, got_norm = clip(tensors, 1.0)  # norm ~6: scaled to norm 1
    assert float(got_norm.asnumpy()) == pytest.approx(norm, rel=1e-6)
    for c, g in zip(clipped, grads):
        np.testing.assert_allclose(c.asnumpy(), g * (1.0 / (norm + 1e-6)), rtol=1e-6)
    assert float(global_grad_norm(clipped).asnumpy()) == pytest.approx(1.0, rel=1e-5)

    unclipped, _ = clip(tensors, 100.0)  # below the threshold: bit-identical
    for c, g in zip(unclipped, grads):
        np.testing.assert_array_equal(c.asnumpy(), g)


def test_clip_disabled_and_given_norm():
    grads, norm = clip_inputs()
    tensors = tuple(Tensor(g) for g in grads)
    same, got_norm = clip_grads_by_global_norm(tensors, 0.0)  # --clip-grad 0
    assert same is tensors and float(got_norm.asnumpy()) == pytest.approx(norm, rel=1e-6)
    # A precomputed norm is used as is (e.g. one already reduced across ranks).
    clipped, got_norm = clip_grads_by_global_norm(tensors, 1.0, norm=Tensor(4.0, ms.float32))
    assert float(got_norm.asnumpy()) == 4.0
    np.testing.assert_allclose(clipped[0].asnumpy(), grads[0] / (4.0 + 1e-6), rtol=1e-6)


@pytest.mark.parametrize("flags, message", [
    (("--decoupled-min-lr", "1e-5"), "--decoupled-min-lr: only with --decoupled-lr; add it, or remove --decoupled-min-lr"),
    (("--decoupled-lr", "1e-4", "--decoupled-min-lr", "2e-4"),
     "--decoupled-min-lr: 0.0002 (default --min-lr) must be in [0, --decoupled-lr 0.0001]"),
    (("--decoupled-lr", "1e-4", "--min-lr", "5e-4", "--lr", "1e-3"),
     "--decoupled-min-lr: 0.0005 (default --min-lr) must be in [0, --decoupled-lr 0.0001]"),
])
def test_decoupled_lr_flags_are_checked_with_one_line_each(flags, message):
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(["--train-iters", "1", *flags]))
    assert message in error.value.problems, error.value.problems


@pytest.mark.parametrize("jit", [False, True])
def test_count_zeros_counts_each_counted_gradient(jit):
    """Megatron's count_zeros_fp32: the gradients another rank counts (a replicated parameter on
    TP rank > 0) are left out, in a graph mixing counted and left-out ones as at TP=2."""
    from rapidgpt.optim.clip_grads import count_zeros
    grads, _ = clip_inputs()
    for k, g in enumerate(grads):
        g.reshape(-1)[: k + 2] = 0.0
    tensors = ms.mutable(tuple(Tensor(g) for g in grads))
    count = ms.jit(count_zeros) if jit else count_zeros
    assert float(count(tensors)) == 2 + 3 + 4
    assert float(count(tensors, None, (True, False, True))) == 2 + 4
    assert float(count(tensors, None, (False, True, False))) == 3


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_zeros_and_params_norm_in_the_compiled_update_match_numpy(precision):
    """Megatron's --log-num-zeros-in-grad and --log-params-norm as the compiled wrapper computes
    them: the zeros of the gradients it is handed (exact count), and the norm of the main (fp32)
    parameters after the AdamW update, not before (fp32: the update is then no longer mapped, so
    the read is ordered after it)."""
    from rapidgpt.config.precision import PrecisionConfig
    from rapidgpt.optim import OptimizerWrapper
    rng = np.random.default_rng(4)
    params = [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)).astype(getattr(ms, precision)), name=f"p{i}")
              for i, s in enumerate([(6, 5), (5,), (3, 7)])]
    wrapper = OptimizerWrapper.around(AdamW(params, lr=0.1, weight_decay=0.1), 1.0,
                                      PrecisionConfig(params_dtype=precision, loss_scale=1.0))
    wrapper.report(num_zeros_in_grad=True, params_norm=True)
    assert not wrapper.optimizer.update_mapped
    update = ms.jit(wrapper.construct)
    for _ in range(2):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        for g in grads:
            g[rng.random(g.shape) < 0.4] = 0.0
        before = math.sqrt(sum((m.asnumpy().astype(np.float64) ** 2).sum() for m in wrapper.main_params))
        updated, _, _, zeros, params_norm, _ = update(ms.mutable(tuple(Tensor(g).astype(p.dtype) for g, p in
                                                                     zip(grads, params))), Tensor(0.1, ms.float32))
        after = math.sqrt(sum((m.asnumpy().astype(np.float64) ** 2).sum() for m in wrapper.main_params))
        assert bool(updated) and float(zeros) == sum(int((g == 0).sum()) for g in grads) > 0
        assert float(params_norm) == pytest.approx(after, rel=1e-6) and abs(after - before) > 1e-3
