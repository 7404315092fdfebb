"""Megatron's learning-rate schedule (megatron/core/optimizer_param_scheduler.py), counted in samples.

Megatron advances its scheduler by the number of samples consumed per iteration
(`global_batch_size`), not by iterations, so a run can change its batch size (or be resumed
with a different one) and still follow the same curve over the data. We do the same: every
"step" below is a sample count.

The scheduler only computes the value; the engine passes it to the optimizer each iteration as
a Tensor (`opt(grads, lr)`), so a changing learning rate never recompiles the jitted step.

`--decoupled-lr` (and `--decoupled-min-lr`, default `--min-lr`) give the input embedding and the
output layer their own curve, Megatron's decoupled learning rate: the same warmup and decay
between those two values. With --use-mup (rapidgpt/config/mup.py) muP's scaled class of parameters
has the curve of --lr and --min-lr times its multiplier (`mup_lr_mult`), from the same
--lr-warmup-init, as Megatron's per-group max_lr/min_lr overrides. `get_lrs()`: the rate of each
group, in the order the optimizer reads them (rapidgpt/optim/adamw.py): --lr, the decoupled one,
muP's.

Weight-decay increment (`--start-weight-decay/--end-weight-decay`) is not implemented: the
weight decay is constant, as with Megatron's default `--weight-decay-incr-style constant`.
"""
import math

from rapidgpt.config.wsd_schedule import DEFAULT_WSD_DECAY_STYLE, WSD_DECAY_STYLES
from rapidgpt.flag_parser import ArgumentError

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


class OptimizerParamScheduler:
    """Linear warmup from `init_lr` to `max_lr`, then decay to `min_lr` over `lr_decay_steps`.

    With `num_steps` the number of samples consumed so far:
      - warmup (`lr_warmup_steps > 0` and `num_steps <= lr_warmup_steps`):
        `init_lr + (max_lr - init_lr) * num_steps / lr_warmup_steps`;
      - "constant": `max_lr` after warmup;
      - past `lr_decay_steps`: `min_lr`;
      - "inverse-square-root": `max(min_lr, max_lr * sqrt(warmup) / sqrt(num_steps))`;
      - otherwise `min_lr + coeff * (max_lr - min_lr)` with `ratio = (num_steps - warmup) /
        (decay - warmup)` and `coeff = 1 - ratio` ("linear") or `0.5 * (cos(pi * ratio) + 1)`
        ("cosine"); "WSD" (rapidgpt/config/wsd_schedule.py): `coeff = 1` until the last
        `wsd_decay_steps` of the decay, then, with `r` the fraction of those done, `2 * 0.5^r - 1`
        ("exponential"), `1 - r`, `0.5 * (cos(pi r) + 1)` or `1 - sqrt(r)` (`lr_wsd_decay_style`).
    """

    def __init__(self, max_lr, min_lr, lr_warmup_steps, lr_decay_steps, lr_decay_style, init_lr=0.0,
                 decoupled_lr=None, decoupled_min_lr=None, mup_lr_mult=None, wsd_decay_steps=None,
                 lr_wsd_decay_style=DEFAULT_WSD_DECAY_STYLE):
        # Each message names the command-line flag(s) the value comes from, as users know those.
        if lr_decay_style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style: unknown style {lr_decay_style!r}; "
                             f"choose one of {', '.join(DECAY_STYLES)}")
        if min_lr < 0:
            raise ValueError(f"--min-lr must be >= 0, got {min_lr}")
        if min_lr > max_lr:
            raise ValueError(f"--min-lr ({min_lr}) must not exceed --lr ({max_lr})")
        if not 0 <= init_lr <= max_lr:
            raise ValueError(f"init_lr ({init_lr}) must lie in [0, --lr ({max_lr})]")
        if lr_decay_steps <= 0:
            raise ValueError(f"the decay length (--lr-decay-iters/--lr-decay-samples, default the "
                             f"training length) must be > 0, got {lr_decay_steps} samples")
        if lr_warmup_steps < 0:
            raise ValueError(f"the warmup (--lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction) "
                             f"must be >= 0, got {lr_warmup_steps} samples")
        if lr_warmup_steps > lr_decay_steps:
            raise ValueError(f"the warmup (--lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction, "
                             f"{lr_warmup_steps} samples) must not exceed the decay length "
                             f"(--lr-decay-iters/--lr-decay-samples, {lr_decay_steps} samples)")
        if decoupled_lr is not None and not 0 <= (min_lr if decoupled_min_lr is None else decoupled_min_lr) \
                <= decoupled_lr:
            raise ValueError(f"--decoupled-min-lr (default --min-lr) must lie in [0, --decoupled-lr ({decoupled_lr})]")
        self.max_lr = float(max_lr)
        self.min_lr = float(min_lr)
        self.init_lr = float(init_lr)
        self.lr_warmup_steps = lr_warmup_steps
        self.lr_decay_steps = lr_decay_steps
        self.lr_decay_style = lr_decay_style
        self.decoupled_lr = None if decoupled_lr is None else float(decoupled_lr)
        self.decoupled_min_lr = None if decoupled_lr is None else float(
            min_lr if decoupled_min_lr is None else decoupled_min_lr)
        self.mup_lr_mult = None if mup_lr_mult is None else float(mup_lr_mult)
        if lr_decay_style == "WSD" and not (wsd_decay_steps and 0 < wsd_decay_steps <= lr_decay_steps):
            raise ValueError(f"--lr-decay-style WSD: the annealing (--lr-wsd-decay-iters/-samples, {wsd_decay_steps} "
                             f"samples) must be in (0, the decay length {lr_decay_steps} samples]")
        if lr_wsd_decay_style not in WSD_DECAY_STYLES:
            raise ValueError(f"--lr-wsd-decay-style: unknown style {lr_wsd_decay_style!r}; choose one of "
                             f"{', '.join(WSD_DECAY_STYLES)}")
        self.wsd_decay_steps = wsd_decay_steps if lr_decay_style == "WSD" else None
        self.lr_wsd_decay_style = lr_wsd_decay_style if lr_decay_style == "WSD" else None
        self.num_steps = 0

    def get_lr(self):
        """The learning rate after `num_steps` samples (see the class docstring)."""
        return self._lr(self.max_lr, self.min_lr)

    def get_lrs(self):
        """(learning rate, then the decoupled one with --decoupled-lr, then muP's with --use-mup)."""
        rates = [self.get_lr()]
        if self.decoupled_lr is not None:
            rates.append(self._lr(self.decoupled_lr, self.decoupled_min_lr))
        if self.mup_lr_mult is not None:
            rates.append(self._lr(self.max_lr * self.mup_lr_mult, self.min_lr * self.mup_lr_mult))
        return tuple(rates)

    def _lr(self, max_lr, min_lr):
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * self.num_steps / self.lr_warmup_steps
        if self.lr_decay_style == "constant":
            return max_lr
        if self.num_steps > self.lr_decay_steps:
            return min_lr
        if self.lr_decay_style == "inverse-square-root":
            # Megatron clamps both to >= 1 so that a zero warmup or step 0 stays finite.
            lr = max_lr * math.sqrt(max(self.lr_warmup_steps, 1)) / math.sqrt(max(self.num_steps, 1))
            return max(min_lr, lr)
        ratio = (self.num_steps - self.lr_warmup_steps) / (self.lr_decay_steps - self.lr_warmup_steps)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:
            coeff = self._wsd_coeff()
        return min_lr + coeff * (max_lr - min_lr)

    def _wsd_coeff(self):
        anneal_start = self.lr_decay_steps - self.wsd_decay_steps
        if self.num_steps <= anneal_start:
            return 1.0
        r = (self.num_steps - anneal_start) / self.wsd_decay_steps
        return {"linear": 1.0 - r, "cosine": 0.5 * (math.cos(math.pi * r) + 1.0),
                "exponential": 2.0 * 0.5 ** r - 1.0, "minus_sqrt": 1.0 - math.sqrt(r)}[self.lr_wsd_decay_style]

    def step(self, increment):
        """Advance by `increment` samples (one iteration = the global batch size); returns the new lr."""
        self.num_steps += increment
        return self.get_lr()

    def state_dict(self):
        return {
            "max_lr": self.max_lr,
            "min_lr": self.min_lr,
            "init_lr": self.init_lr,
            "lr_warmup_steps": self.lr_warmup_steps,
            "lr_decay_steps": self.lr_decay_steps,
            "lr_decay_style": self.lr_decay_style,
            "decoupled_lr": self.decoupled_lr,
            "decoupled_min_lr": self.decoupled_min_lr,
            "mup_lr_mult": self.mup_lr_mult,
            "wsd_decay_steps": self.wsd_decay_steps,
            "lr_wsd_decay_style": self.lr_wsd_decay_style,
            "num_steps": self.num_steps,
        }

    def load_state_dict(self, state_dict, override=False, use_checkpoint=False):
        """Restore `num_steps`; the schedule settings must equal this run's unless `override`
        (keep this run's) or `use_checkpoint` (take the checkpoint's), Megatron's two flags.

        Megatron also refuses a checkpoint whose schedule differs unless told: silently switching
        curves mid-run is rarely what the user meant. Every differing setting is reported at once.
        """
        differing = {name: (value, state_dict.get(name)) for name, value in self.state_dict().items()
                     if name != "num_steps" and state_dict.get(name) != value}
        if differing and use_checkpoint:
            for name, (_, saved) in differing.items():
                setattr(self, name, saved)
        elif differing and not override:
            listed = "; ".join(f"{SETTING_FLAGS[name]}: this run {mine!r}, checkpoint {saved!r}"
                               for name, (mine, saved) in differing.items())
            raise ValueError(f"the LR schedule differs from the checkpoint's ({listed}); pass "
                             f"--override-opt_param-scheduler to continue with this run's schedule, or "
                             f"--use-checkpoint-opt_param-scheduler to continue with the checkpoint's")
        self.num_steps = state_dict["num_steps"]


def learning_rates(scheduler):
    """The rates of `scheduler` (RapidGPT's, or a user's with only `get_lr()`) for this step: (lr,),
    or one per group (OptimizerParamScheduler.get_lrs)."""
    return scheduler.get_lrs() if hasattr(scheduler, "get_lrs") else (scheduler.get_lr(),)


# The flags behind each schedule setting (lengths are kept in samples: iterations x global batch).
SETTING_FLAGS = {
    "max_lr": "--lr", "min_lr": "--min-lr", "init_lr": "--lr-warmup-init",
    "lr_warmup_steps": "warmup in samples (--lr-warmup-iters x --global-batch-size, or --lr-warmup-samples"
                       "/--lr-warmup-fraction)",
    "lr_decay_steps": "decay length in samples (--lr-decay-iters, default --train-iters, x --global-batch-size; "
                      "or --lr-decay-samples)",
    "lr_decay_style": "--lr-decay-style",
    "decoupled_lr": "--decoupled-lr", "decoupled_min_lr": "--decoupled-min-lr",
    "wsd_decay_steps": "the WSD annealing in samples (--lr-wsd-decay-iters x --global-batch-size, or "
                       "--lr-wsd-decay-samples)",
    "lr_wsd_decay_style": "--lr-wsd-decay-style",
    "mup_lr_mult": "muP's learning-rate multiplier (--use-mup, --hidden-size / --mup-base-hidden-size, --optimizer)",
}


def build_lr_scheduler(args):
    """An `OptimizerParamScheduler` from Megatron's flags (Megatron's get_optimizer_param_scheduler).

    Sample-based runs (`--train-samples`) give the decay and warmup in samples
    (`--lr-decay-samples`, `--lr-warmup-samples`); iteration-based runs (`--train-iters`) convert
    iterations to samples with `--global-batch-size`. `--lr-warmup-fraction` sets the warmup as a
    fraction of the decay length and excludes `--lr-warmup-iters/-samples`. `--lr-warmup-init`
    (default 0) is where the warmup starts.
    """
    train_iters = getattr(args, "train_iters", None)
    train_samples = getattr(args, "train_samples", None)
    warmup_fraction = getattr(args, "lr_warmup_fraction", None)
    # Checked first: the engine also derives --train-iters from --train-samples for its loop.
    if train_samples:
        decay_steps = getattr(args, "lr_decay_samples", None)
        if decay_steps is None:
            decay_steps = train_samples
        warmup_steps = getattr(args, "lr_warmup_samples", 0)
        warmup_flag = "--lr-warmup-samples"
        wsd_steps = getattr(args, "lr_wsd_decay_samples", None)
    elif train_iters:
        decay_iters = getattr(args, "lr_decay_iters", None)
        if decay_iters is None:
            decay_iters = train_iters
        warmup_iters = getattr(args, "lr_warmup_iters", 0)
        warmup_flag = "--lr-warmup-iters"
        decay_steps = decay_iters * args.global_batch_size
        warmup_steps = warmup_iters * args.global_batch_size
        wsd_iters = getattr(args, "lr_wsd_decay_iters", None)
        wsd_steps = None if wsd_iters is None else wsd_iters * args.global_batch_size
    else:
        raise ArgumentError("--train-iters: the LR schedule needs the training length; give --train-iters "
                            "or --train-samples (a Finetuner: --epochs)")
    if warmup_steps > decay_steps:
        unit = args.global_batch_size if not train_samples else 1
        raise ArgumentError(
            f"{warmup_flag}: the warmup ({warmup_steps // unit} {'samples' if train_samples else 'iterations'}) is "
            f"longer than the decay ({decay_steps // unit}: --lr-decay-{'samples' if train_samples else 'iters'}, "
            f"default the training length{', here from --epochs' if getattr(args, 'epochs', None) else ''}); "
            f"shorten the warmup")
    if warmup_fraction is not None:
        if warmup_steps:
            raise ArgumentError(f"--lr-warmup-fraction: give only one of --lr-warmup-fraction and {warmup_flag}")
        if not 0 <= warmup_fraction <= 1:
            raise ArgumentError(f"--lr-warmup-fraction: must lie in [0, 1], got {warmup_fraction}")
        warmup_steps = warmup_fraction * decay_steps
    return OptimizerParamScheduler(
        max_lr=args.lr,
        min_lr=getattr(args, "min_lr", 0.0),
        lr_warmup_steps=warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=getattr(args, "lr_decay_style", "linear"),
        init_lr=getattr(args, "lr_warmup_init", 0.0),
        decoupled_lr=getattr(args, "decoupled_lr", None),
        decoupled_min_lr=getattr(args, "decoupled_min_lr", None),
        mup_lr_mult=args.mup.lr_mult(getattr(args, "optimizer", "adam")) if getattr(args, "mup", None) else None,
        wsd_decay_steps=wsd_steps,
        lr_wsd_decay_style=getattr(args, "lr_wsd_decay_style", DEFAULT_WSD_DECAY_STYLE),
    )
