"""Megatron's result validation ("rerun engine"): flags, checks and their configuration.

`--rerun-mode` (Megatron's default `validate_results`) checks every training step after the
first: a NaN or Inf loss or gradient norm (unless --no-check-for-nan-in-loss-and-grad, and not
under fp16's dynamic loss scale, where they are the scaler's signal, as Megatron turns them off),
a spiky loss (`--check-for-spiky-loss`) and unexpectedly large gradients (`--check-for-large-grads`).
A rejected step is held (not applied) and run again on the same batches to tell a faulty device
from a bad result; rapidgpt/training/rerun_state_machine.py is the machine. `report_stats` runs
every step twice and reports how much the results vary; `disabled` runs each step once and stops
the run at a fatal rejection (NaN/Inf), as Megatron raises there.

`--error-injection-rate N` rejects a check's result once in N on average (Megatron's
RerunErrorInjector) as `--error-injection-type` would show up: a `transient_error` is not
reproduced by the re-run, a `persistent_error` is reproduced in place but not on another device,
a `correct_result` everywhere.

This module holds the flags and their checks (read before MindSpore loads).
"""
from dataclasses import dataclass

RERUN_MODES = ("disabled", "validate_results", "report_stats")
INJECTION_TYPES = ("correct_result", "transient_error", "persistent_error")
SPIKE_FACTOR = 10          # Megatron's SPIKY_LOSS_FACTOR and its large-gradient threshold
SPIKE_SAMPLES = 100        # values observed before a spike can be told (is_unexpectedly_large)


@dataclass(frozen=True)
class Check:
    """One of Megatron's validate_result calls: the value it reads ("loss" or "grad norm"), what
    rejects it ("nan", "inf", or "large": at least SPIKE_FACTOR x the largest of the first
    SPIKE_SAMPLES values), whether a confirmed rejection stops the run, and the relative difference
    a re-run may show and still reproduce it."""
    message: str
    value: str
    rejects: str
    fatal: bool
    tolerance: float


def _checks(nan, spiky_loss, large_grads):
    """Megatron's calls in its order: the loss's (loss_func), then the gradients' (before the
    data-parallel reduction there; here the step's global gradient norm)."""
    grads = "in backward pass before data-parallel communication collective"
    found = []
    if nan:
        found += [Check("found NaN in local forward loss calculation", "loss", "nan", True, 0.0),
                  Check("found Inf in local forward loss calculation", "loss", "inf", True, 0.0)]
    if spiky_loss:
        found.append(Check("Spiky loss", "loss", "large", False, 0.0))
    if nan:
        found += [Check(f"found NaN in local grad norm {grads}", "grad norm", "nan", True, 0.001),
                  Check(f"found Inf in local grad norm {grads}", "grad norm", "inf", True, 0.001)]
    if large_grads:
        found.append(Check(f"found unexpected large grads {grads}", "grad norm", "large", False, 0.001))
    return tuple(found)


@dataclass(frozen=True)
class RerunConfig:
    mode: str = "disabled"
    checks: tuple = ()
    injection_rate: int = 0
    injection_type: str = "transient_error"
    tracker_filename: str = None

    @property
    def validates(self):
        """The step graph takes the checks' limits (a step can be held and run again)."""
        return self.mode != "disabled" and bool(self.checks)


def add_rerun_args(parser):
    g = parser.add_argument_group("result validation (Megatron's rerun engine)")
    g.add_argument("--rerun-mode", choices=RERUN_MODES, default="validate_results",
                   help="validate_results: re-run a rejected step to tell a faulty device from a bad result; "
                        "report_stats: run every step twice and report how its results vary; disabled: stop at "
                        "a NaN/Inf")
    g.add_argument("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad",
                   action="store_false", help="do not reject NaN/Inf losses and gradient norms (such a step is "
                                              "skipped and counted in the iteration line)")
    g.add_argument("--check-for-spiky-loss", action="store_true",
                   help=f"reject a loss {SPIKE_FACTOR}x the largest of the first {SPIKE_SAMPLES} validated steps'")
    g.add_argument("--check-for-large-grads", action="store_true",
                   help=f"reject a gradient norm {SPIKE_FACTOR}x the largest of the first {SPIKE_SAMPLES}")
    g.add_argument("--error-injection-rate", type=int, default=0,
                   help="reject a check's result once in this many on average, to test the machine (0: never)")
    g.add_argument("--error-injection-type", choices=INJECTION_TYPES, default="transient_error",
                   help="how an injected rejection behaves on the re-runs")
    g.add_argument("--result-rejected-tracker-filename", default=None,
                   help="append each rejection to this file; iterations rejected twice on a rank are then "
                        "skipped (added to --iterations-to-skip)")


def check_rerun_args(args, check):
    """After the precision checks: args.rerun (a RerunConfig); the tracker file's repeated
    rejections join --iterations-to-skip, as in Megatron."""
    check.require(args.error_injection_rate >= 0,
                  f"--error-injection-rate: {args.error_injection_rate} must be 0 (off) or a positive rate")
    nan = args.check_for_nan_in_loss_and_grad
    precision = getattr(args, "precision", None)
    dynamic_scale = precision is not None and precision.scales_loss and precision.loss_scale is None
    nan = nan and not dynamic_scale         # NaN/Inf are the dynamic loss scale's signal (Megatron turns them off)
    args.rerun = RerunConfig(args.rerun_mode, _checks(nan, args.check_for_spiky_loss, args.check_for_large_grads),
                             args.error_injection_rate, args.error_injection_type,
                             args.result_rejected_tracker_filename)
    asked = [flag for flag, given in (("--error-injection-rate", args.error_injection_rate),
                                      ("--rerun-mode report_stats", args.rerun_mode == "report_stats")) if given]
    if asked and not args.rerun.checks:
        args.megatron_flag_lines = [*getattr(args, "megatron_flag_lines", ()),
                                    f" > {', '.join(asked)}: no result is checked (under fp16's dynamic loss scale NaN "
                                    f"and Inf are the scaler's signal, as in Megatron); add --check-for-spiky-loss or "
                                    f"--check-for-large-grads"]
    tracker = args.result_rejected_tracker_filename
    if tracker is not None:
        try:
            with open(tracker, "a", encoding="utf-8"):
                pass
        except OSError as e:
            check.add(f"--result-rejected-tracker-filename {tracker}: cannot be appended to ({e.strerror}); "
                      f"give a writable file")
            return
        repeated = iterations_rejected_twice(tracker)
        args.iterations_to_skip = sorted(set(args.iterations_to_skip) | set(repeated))


def iterations_rejected_twice(tracker):
    """The iterations to skip by the tracker file's records (Megatron's rule): a rejection recorded
    with reruns disabled, or reproduced by a re-run, seen twice on one rank at one iteration, unless
    another rank of the same job also recorded that iteration (then the cause is not one device)."""
    import re
    record = re.compile(r"ts=.+ node=.+ device=.+ jobID=(.+) rank=(\d+) iteration=(\d+) status=(\S+) result=.+ "
                        r"message=.+")
    counted = ("rerun_disabled", "first_rerun_reproducible", "second_rerun_reproducible")
    seen, twice, ranks_of = set(), set(), {}
    with open(tracker, encoding="utf-8") as f:
        for line in f:
            match = record.search(line)
            if not match or match[4].rsplit(".", 1)[-1].lower() not in counted:
                continue
            job, rank, iteration = match[1], int(match[2]), int(match[3])
            if (rank, iteration) in seen:
                twice.add(iteration)
            seen.add((rank, iteration))
            ranks_of.setdefault((job, iteration), set()).add(rank)
    several_ranks = {iteration for (_, iteration), ranks in ranks_of.items() if len(ranks) > 1}
    return sorted(twice - several_ranks)
