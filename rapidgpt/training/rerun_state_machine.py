"""Megatron's rerun state machine for RapidGPT's one-graph step: tell a faulty device from a bad result.

The checks and flags are rapidgpt/config/rerun.py's. Megatron validates each micro-batch's loss
(and each gradient bucket) before the optimizer step and, when one is rejected, runs the
iteration's forward and backward again before any update. Here forward, backward and update are
one compiled graph (rapidgpt/training/step.py), so the checks are a graph input instead: the step
gets their limits, `[loss limit, norm limit, hold non-finite, hold]`, and a step they reject is
*held* (nothing applied, not even the fp16 loss scale's update). The step is then run again on
the same batches, which computes the same (dropout masks follow the iteration number; nothing
else changed), and the two results are compared, as Megatron's machine does:

    initial run rejected          -> run again in place (same device)
      not reproduced              -> "Possible transient error!": a fatal check (NaN/Inf) stops the
                                     run, exit 17; a non-fatal one (spike) goes on with the re-run,
                                     which is applied
      reproduced                  -> fatal: save a checkpoint of the iteration before, with this
                                     state and every rank's node and device, exit 16; non-fatal:
                                     go on with the re-run
    resumed from that checkpoint  -> run the iteration again (held): on the same node and device as
                                     before, exit 16 again (resume elsewhere); reproduced elsewhere:
                                     "Correct result (but possible Application error)"; not
                                     reproduced: "Possible persistent error!"; both exit 17

The step's values are what is checked: the loss (averaged over the micro-batches and data-parallel
ranks, which every rank sees) and the global gradient norm, once per step, where Megatron checks
each rank's micro-batch losses and local buckets; so every rank decides alike without a collective.
Megatron's exit codes and messages are kept, so its tooling reads the logs. On CPU the "device" is
the rank.
"""
import datetime
import math
import os

import numpy as np

from rapidgpt.config.rerun import SPIKE_FACTOR, SPIKE_SAMPLES

EXIT_CODE_RESUME_TO_DISAMBIGUATE = 16       # Megatron's
EXIT_CODE_FAILED_ON_RESULT_VALIDATION = 17  # Megatron's
NO_LIMIT = math.inf
INJECTED_NAMES = {"correct_result": "Expected result", "transient_error": "Transient error",
                  "persistent_error": "Persistent error"}


def relative_difference(a, b):
    """Megatron's comparison of an initial result `a` and a re-run's `b`: 0 when equal (or both
    NaN), inf when one is NaN or infinite and the other not, else |a - b| / mean(|a|, |b|)."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return math.inf
    return abs((a - b) / (a + b) * 2)


def this_device(rank):
    """(node, device) of this process: the host name, and the accelerator's id (on CPU the rank)."""
    import mindspore as ms
    if ms.get_context("device_target") == "CPU":
        return os.uname()[1], rank
    return os.uname()[1], int(ms.get_context("device_id"))


class Outcome:
    """What the training loop does after a step: `result` (a StepResult, or None when the run
    stops), `save` (a checkpoint of the iteration before), `exit_code` (None: go on)."""

    def __init__(self, result=None, save=False, exit_code=None):
        self.result, self.save, self.exit_code = result, save, exit_code


class VariabilityStats:
    """report_stats: the relative differences between a step's two runs, per check."""

    def __init__(self):
        self.differences = []

    def describe(self):
        values = np.asarray(self.differences, np.float64)
        identical = int(np.sum(values == 0))
        if identical == len(values):
            return f"{identical:,} samples, all identical"
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return (f"{len(values):,}/{identical:,} total/identical samples, rel. variability: avg= {values.mean():.3E}, "
                f"p50= {p50:.3E}, p90= {p90:.3E}, p99= {p99:.3E}, max: {values.max():.3E}")


class RerunStateMachine:
    """`run_step(iteration, step) -> Outcome` around the compiled step, `step(validation)` running
    the iteration's batches (the same ones each call) with the checks' limits (None: without).

    `config`: a rapidgpt.config.rerun.RerunConfig; `seed`: the injection's draws (reproducible per
    iteration); `identity`: this rank's (node, device); `gather(values)`: every rank's float
    vector as rows (rapidgpt.parallel.comm.gather_over_ranks); `any_rank(flag)`: whether a rank's
    flag is set (a sum over ranks).
    """

    REPORTING_INTERVAL = 2      # iterations between report_stats' lines (Megatron's)

    def __init__(self, config, seed, rank, world_size, logger, identity, gather, any_rank):
        self.config, self.seed, self.rank, self.world_size = config, seed, rank, world_size
        self.logger, self.identity, self.gather, self.any_rank = logger, identity, gather, any_rank
        self.state = "not_running"
        self.iteration = None                   # the iteration a checkpoint must re-run
        self.failed = None                      # index of the check that rejected it
        self.initial = None                     # its value in the initial run
        self.injected = None                    # the injection type, until the re-runs settled it
        self.suspects = None                    # every rank's (node, device) of the first re-run
        self.samples = {"loss": [], "grad norm": []}     # first SPIKE_SAMPLES finite values
        self.stats = {}
        self.announced = False
        self.first_step_done = False

    # -- the step ---------------------------------------------------------------------------------
    def run_step(self, iteration, step):
        config = self.config
        if not config.validates:
            result = step(None)
            if config.mode == "disabled" and config.checks:
                self._check_disabled(iteration, result)
            self.first_step_done = True
            return Outcome(result)
        self._announce()
        if self.state == "will_rerun_from_checkpoint" and iteration == self.iteration:
            return self._rerun_from_checkpoint(iteration, step)
        if config.mode == "report_stats":
            return self._report_stats(iteration, step)
        validating = self.first_step_done     # Megatron checks no first step: no checkpoint may exist yet
        self.first_step_done = True
        injected_at = self._injection(iteration) if validating else None
        result = step(self._limits(hold=injected_at is not None, checking=validating))
        failed = self._first_rejected(result, injected_at) if validating else None
        if (failed is not None) != result.held:
            raise RuntimeError(f"iteration {iteration}: the step graph and the host disagree on the checks "
                               f"(held {result.held}, rejected check {failed})")
        if failed is None:
            return Outcome(result)
        return self._rerun_in_place(iteration, step, failed, result, injected_at is not None)

    def _rerun_in_place(self, iteration, step, failed, result, injected):
        check = self.config.checks[failed]
        initial = self._value(result, check)
        self.injected = self.config.injection_type if injected else None
        self._track(iteration, "initial_run", initial, check)
        self.logger.error(f"Unexpected result {initial} on rank {self.rank} at iteration #{iteration} "
                          f"invocation #1 (message='{check.message}')")
        self.logger.warning("Need to rerun step to check reproducibility of initial result")
        # A fatal check's re-run stays held (a reproduced result is re-run from a checkpoint); a
        # non-fatal one's is applied unless it is not finite.
        rerun = step(self._limits(hold=check.fatal, non_finite=not check.fatal))
        value = self._value(rerun, check)
        if self._compare(initial, value, "in_place") > check.tolerance:
            self._log_failure(iteration, "First rerun: unexpected result is not reproducible within the "
                                         f"tolerance ({value} != {initial})", check.fatal)
            self._track(iteration, "first_rerun_not_reproducible", value, check)
            self._log_failure(iteration, "Possible transient error!", check.fatal)
            self.injected = None
            if check.fatal:
                self.logger.warning("Exiting now. The job can be resumed from a previous checkpoint")
                return Outcome(exit_code=EXIT_CODE_FAILED_ON_RESULT_VALIDATION)
            self.logger.warning("Continuing normal execution because failed validation was not fatal")
            return Outcome(rerun)
        self._track(iteration, "first_rerun_reproducible", value, check)
        self._log_failure(iteration, "First rerun: unexpected result is reproducible within the tolerance "
                                     f"({value} = {initial}). Need to rerun on a different GPU to verify "
                                     "correctness.", check.fatal)
        if not check.fatal:
            self.injected = None
            self.logger.warning("Continuing normal execution because failed validation was not fatal")
            return Outcome(rerun)
        self.state, self.iteration, self.failed, self.initial = "will_rerun_from_checkpoint", iteration, failed, initial
        self.suspects = self._every_rank_identity()
        self.logger.warning("Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun "
                            "the last iteration and establish a diagnostic")
        return Outcome(save=True, exit_code=EXIT_CODE_RESUME_TO_DISAMBIGUATE)

    def _rerun_from_checkpoint(self, iteration, step):
        """The iteration a checkpoint was saved to re-run (always a fatal check's): run held, then
        every outcome stops the run, as Megatron's does."""
        self.first_step_done = True
        check = self.config.checks[self.failed]
        result = step(self._limits(hold=True))
        value = self._value(result, check)
        node, device = self.identity
        if self.any_rank(list(self.identity) == list(self.suspects[self.rank])):
            self.logger.error(f"Got rescheduled on the same GPU. Need to resume again from the same checkpoint "
                              f"(node: {node}, gpu: {device})")
            self.logger.warning("Need to restart job from the same checkpoint because it was scheduled on the same "
                                "node/GPU")
            self.logger.warning("Exiting now. Please resume the job from the same checkpoint to rerun the last "
                                "iteration and establish a diagnostic")
            return Outcome(exit_code=EXIT_CODE_RESUME_TO_DISAMBIGUATE)
        if self._compare(self.initial, value, "from_checkpoint") > check.tolerance:
            self._track(iteration, "second_rerun_not_reproducible", value, check)
            self.logger.warning("Second rerun: unexpected result is not reproducible on a different GPU, therefore "
                                f"was likely incorrect ({value} != {self.initial})")
            self._log_failure(iteration, "Possible persistent error!", True)
        else:
            self._track(iteration, "second_rerun_reproducible", value, check)
            self.logger.warning("Second rerun: unexpected result is reproducible on a different GPU, therefore it "
                                f"was likely correct ({value} = {self.initial})")
            self._log_failure(iteration, f"Correct result (but possible Application error) ({check.message})", True)
        self.logger.warning("Exiting now. A checkpoint at the last iteration already exists if further "
                            "examination is needed")
        return Outcome(exit_code=EXIT_CODE_FAILED_ON_RESULT_VALIDATION)

    def _report_stats(self, iteration, step):
        """report_stats: every step run held, then again and applied; the relative differences of
        each check's value are reported every REPORTING_INTERVAL iterations."""
        self.first_step_done = True
        first = step(self._limits(hold=True))
        second = step(self._limits())
        for check in self.config.checks:
            stats = self.stats.setdefault(check.message, VariabilityStats())
            stats.differences.append(relative_difference(self._value(first, check), self._value(second, check)))
        if (iteration - 1) % self.REPORTING_INTERVAL == 0:     # Megatron counts from 0
            self.logger.info("Stats on computation determinism in validation calls")
            for message, stats in self.stats.items():
                self.logger.info(f"  From validation call '{message}':")
                self.logger.info(f"    {stats.describe()}")
        return Outcome(second)

    def _check_disabled(self, iteration, result):
        """disabled: the checks still run on the host; a fatal rejection stops the run (Megatron
        raises), a non-fatal one is logged."""
        for check in self.config.checks:
            value = self._value(result, check)
            if self._rejects(check, value):
                self._track(iteration, "rerun_disabled", value, check)
                message = (f"Rank {self.rank}, node {self.identity[0]}, device {self.identity[1]}, iteration "
                           f"{iteration}: Unexpected result {value} (message='{check.message}')")
                if check.fatal:
                    raise ResultRejected(f"{message}; --rerun-mode validate_results re-runs such a step to tell a "
                                         f"faulty device from bad data, --no-check-for-nan-in-loss-and-grad skips it")
                self.logger.warning(message)
            self._sample(check, value)

    # -- checks -----------------------------------------------------------------------------------
    @staticmethod
    def _value(result, check):
        return result.loss if check.value == "loss" else result.grad_norm

    def _limit(self, value):
        """A spike check's limit on the loss or grad norm (float32, as the graph compares it)."""
        if not any(c.rejects == "large" and c.value == value for c in self.config.checks):
            return NO_LIMIT
        seen = self.samples[value]
        return float(np.float32(max(seen) * SPIKE_FACTOR)) if len(seen) >= SPIKE_SAMPLES else NO_LIMIT

    def _limits(self, hold=False, checking=False, non_finite=False):
        """The step's validation input: every check's limits when `checking`, else only the NaN/Inf
        checks' with `non_finite`; `hold` the step whatever its values. Without any, a non-finite
        step is skipped as an overflow (the first step, a re-run that is not checked)."""
        nan = any(c.rejects == "nan" for c in self.config.checks)
        if not checking:
            return [NO_LIMIT, NO_LIMIT, float(nan and non_finite), float(hold)]
        return [self._limit("loss"), self._limit("grad norm"), float(nan), float(hold)]

    def _rejects(self, check, value):
        if check.rejects == "nan":
            return math.isnan(value)
        if check.rejects == "inf":
            return math.isinf(value)
        return math.isfinite(value) and value >= self._limit(check.value)

    def _sample(self, check, value):
        seen = self.samples[check.value]
        if check.rejects == "large" and math.isfinite(value) and len(seen) < SPIKE_SAMPLES:
            seen.append(value)
            if len(seen) == SPIKE_SAMPLES:
                self.logger.warning(f"Max value for {check.value}: {max(seen)}")

    def _first_rejected(self, result, injected_at):
        """The index of the first check (in Megatron's order) rejecting the step, injected or not;
        the spike checks before it take the value as a sample."""
        for i, check in enumerate(self.config.checks):
            if i == injected_at:
                return i
            value = self._value(result, check)
            if self._rejects(check, value):
                return i
            self._sample(check, value)
        return None

    def _injection(self, iteration):
        """The check an injected error rejects at `iteration` (None: none), as Megatron's draws:
        a check is hit when (uniform draw in [0, rate) + rank) % rate == 0 on some rank; the draws
        are seeded by the iteration, so every rank draws alike and a resumed run as the first."""
        rate = self.config.injection_rate
        if rate <= 0:
            return None
        draws = np.random.RandomState((self.seed * 1000003 + iteration) % 2 ** 32).randint(0, rate, len(self.config.checks))
        for i, draw in enumerate(draws):
            hit = [rank for rank in range(self.world_size) if (draw + rank) % rate == 0]
            if hit:
                if self.rank in hit:
                    self.logger.warning(f"Injecting error type {INJECTED_NAMES[self.config.injection_type]}")
                return i
        return None

    def _compare(self, initial, value, rerun):
        """The relative difference of a re-run, or what the injected error makes it: a transient
        error differs in place, a persistent one from the checkpoint, a correct result never."""
        if self.injected is None:
            return relative_difference(initial, value)
        if rerun == "in_place":
            return math.inf if self.injected == "transient_error" else 0.0
        return math.inf if self.injected == "persistent_error" else 0.0

    # -- logs, identity, checkpoint --------------------------------------------------------------
    def _announce(self):
        if not self.announced:
            self.announced = True
            self.logger.warning("Result validation enabled" if self.config.mode == "validate_results"
                                else "Result validation enabled (report_stats: every step runs twice)")

    def _log_failure(self, iteration, message, fatal):
        node, device = self.identity
        line = f"Rank {self.rank}, node {node}, device {device}, iteration #{iteration}: {message}!"
        (self.logger.error if fatal else self.logger.warning)(line)

    def _track(self, iteration, status, value, check):
        """--result-rejected-tracker-filename: one line per event, Megatron's format."""
        if self.config.tracker_filename is None:
            return
        node, device = self.identity
        try:
            with open(self.config.tracker_filename, "a", encoding="utf-8") as f:
                f.write(f"ts={datetime.datetime.now()} node={node} device={device} jobID="
                        f"{os.getenv('SLURM_JOBID', 'N/A')} rank={self.rank} iteration={iteration} "
                        f"status={status} result={value} message='{check.message}'\n")
        except OSError as e:
            self.logger.error(f"Could not log validation error to --result-rejected-tracker-filename "
                              f"{self.config.tracker_filename} ({e})")

    def _every_rank_identity(self):
        """[(node, device)] of every rank, by rank (host names as bytes through a float gather)."""
        node, device = self.identity
        encoded = list(node.encode("utf-8")[:255])
        rows = self.gather([float(len(encoded)), float(device)] + [float(b) for b in encoded]
                           + [0.0] * (255 - len(encoded)))
        return [(bytes(int(b) for b in row[2:2 + int(row[0])]).decode("utf-8"), int(row[1])) for row in rows]

    def state_dict(self):
        """What a checkpoint keeps (its metadata.json, rank 0's: every rank decides alike)."""
        return {"mode": self.config.mode, "state": self.state, "iteration": self.iteration,
                "failed_check": None if self.failed is None else self.config.checks[self.failed].message,
                "initial_result": self.initial, "injected": self.injected,
                "suspects": self.suspects, "samples": self.samples}

    def load_state_dict(self, state, same_layout):
        """Resume: the spike checks' samples, and a pending re-run unless the layout changed."""
        if not state:
            return
        if self.config.mode == "disabled":
            if state["state"] == "will_rerun_from_checkpoint":
                self.logger.warning("RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint")
            return
        self.samples = {key: list(values) for key, values in state["samples"].items()}
        if state["state"] != "will_rerun_from_checkpoint":
            return
        if not same_layout:
            self.logger.warning("Job sharding has changed: Rerun state will be ignored")
            return
        messages = [check.message for check in self.config.checks]
        if state["failed_check"] not in messages:
            self.logger.warning(f"the checkpoint asks to re-run iteration {state['iteration']} for the check "
                                f"'{state['failed_check']}', which this run does not make: Rerun state will be "
                                f"ignored")
            return
        self.logger.warning("Getting RerunStateMachine state from checkpoint. Will rerun step.")
        self.state, self.iteration = state["state"], state["iteration"]
        self.failed, self.initial = messages.index(state["failed_check"]), state["initial_result"]
        self.injected, self.suspects = state["injected"], [tuple(s) for s in state["suspects"]]


class ResultRejected(RuntimeError):
    """A fatal check rejected a step under --rerun-mode disabled (the run stops, as Megatron's)."""
