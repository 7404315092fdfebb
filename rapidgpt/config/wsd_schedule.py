"""Megatron's warmup-stable-decay schedule: `--lr-decay-style WSD`.

After the warmup the rate stays at --lr until the last `--lr-wsd-decay-iters` iterations (or
`--lr-wsd-decay-samples` samples, with --train-samples) of the decay length (--lr-decay-iters,
default the training length), over which it anneals to --min-lr in the `--lr-wsd-decay-style`:
exponential (Megatron's default: 2 * 0.5^r - 1), linear, cosine or minus_sqrt (1 - sqrt(r)), r the
fraction of the annealing done. The curve itself is rapidgpt/optim/lr_scheduler.py's
(OptimizerParamScheduler, Megatron's get_lr); this module holds the flags and their checks, read
before MindSpore loads.
"""

WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
DEFAULT_WSD_DECAY_STYLE = WSD_DECAY_STYLES[0]          # Megatron's


def add_wsd_args(parser):
    g = parser.add_argument_group("warmup-stable-decay schedule (--lr-decay-style WSD)")
    g.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES, default=DEFAULT_WSD_DECAY_STYLE,
                   help="the annealing's shape at the end of a WSD schedule")
    g.add_argument("--lr-wsd-decay-iters", type=int, default=None,
                   help="the annealing's length in iterations (with --train-iters)")
    g.add_argument("--lr-wsd-decay-samples", type=int, default=None,
                   help="the annealing's length in samples (with --train-samples)")


def check_wsd_args(args, check):
    """Validate into `check` (a flag_parser.Problems): WSD needs its annealing length, in the unit
    of the run's training length, and no longer than the decay; the WSD flags need WSD."""
    iters, samples = args.lr_wsd_decay_iters, args.lr_wsd_decay_samples
    if args.lr_decay_style != "WSD":
        given = [flag for flag, value in (("--lr-wsd-decay-iters", iters), ("--lr-wsd-decay-samples", samples),
                                          ("--lr-wsd-decay-style", None if args.lr_wsd_decay_style == DEFAULT_WSD_DECAY_STYLE
                                           else args.lr_wsd_decay_style)) if value is not None]
        check.require(not given, f"{', '.join(given)}: the WSD schedule's settings; add --lr-decay-style WSD, or "
                                 f"drop them")
        return
    if args.train_samples:
        flag, length, other, other_value, unit = ("--lr-wsd-decay-samples", samples, "--lr-wsd-decay-iters", iters,
                                                  "--train-samples")
    else:
        flag, length, other, other_value, unit = ("--lr-wsd-decay-iters", iters, "--lr-wsd-decay-samples", samples,
                                                  "--train-iters")
    if not check.require(length is not None and other_value is None,
                         f"--lr-decay-style WSD: give the annealing's length as {flag} (the unit of {unit})"
                         + (f", not {other}" if other_value is not None else "")):
        return
    decay = args.lr_decay_samples if args.train_samples else args.lr_decay_iters
    decay = decay or (args.train_samples if args.train_samples else args.train_iters)
    check.require(decay is None or 0 < length <= decay,
                  f"{flag}: {length} must be in [1, the decay length {decay}] (--lr-decay-"
                  f"{'samples' if args.train_samples else 'iters'}, default {unit})")
