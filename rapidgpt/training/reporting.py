"""What a run reports: Megatron's log lines (so existing log parsers keep working), a tqdm bar,
and TensorBoard scalars under --tensorboard-dir."""
import math
import sys

from tqdm import tqdm

from rapidgpt.device import memory_in_use
from rapidgpt.global_vars import get_logger, get_scalar_writer, get_timers, is_console_rank

# The training loop's timers (rapidgpt/training/trainer.py), shown by --timing-log-level 1 and
# written by --log-timers-to-tensorboard.
LOOP_TIMERS = ["batch-generator", "forward-backward-optimizer", "evaluate", "forward-compute", "backward-compute",
               "pipeline-p2p"]


def training_log_line(iteration, train_iters, consumed_samples, ms_per_iteration, learning_rate,
                      global_batch_size, losses, loss_scale, grad_norm, skipped, nan, per_second,
                      unit="tokens", tflops_per_rank=None, decoupled_learning_rate=None, num_zeros=None,
                      params_norm=None):
    """Megatron's training line, field for field (`losses`: {name: interval mean};
    `tflops_per_rank`: --log-throughput's figure, or None; `decoupled_learning_rate`: --decoupled-lr's
    current rate, or None; `num_zeros`, `params_norm`: --log-num-zeros-in-grad's and
    --log-params-norm's, or None)."""
    line = f" iteration {iteration:8d}/{train_iters:8d} |"
    line += f" consumed samples: {consumed_samples:12d} |"
    line += f" elapsed time per iteration (ms): {ms_per_iteration:.1f} |"
    if tflops_per_rank is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {tflops_per_rank:.1f} |"
    line += f" learning rate: {learning_rate:.6E} |"
    if decoupled_learning_rate is not None:
        line += f" decoupled learning rate: {decoupled_learning_rate:.6E} |"
    line += f" global batch size: {global_batch_size:5d} |"
    for name, value in losses.items():       # Megatron leaves out a loss no update contributed to
        line += f" {name}: {value:.6E} |"
    line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    if num_zeros is not None:
        line += f" num zeros: {num_zeros} |"       # a float, as Megatron's all-reduced statistic
    if params_norm is not None:
        line += f" params norm: {params_norm:.3f} |"
    line += f" number of skipped iterations: {skipped:3d} |"
    line += f" number of nan iterations: {nan:3d} |"
    line += f" {unit} per second: {per_second:.1f} |"
    return line


def validation_lines(label, losses):
    """Megatron's validation block: a dashed line, the values with perplexity, a dashed line."""
    text = f" validation loss at {label} | "
    for name, value in losses.items():
        text += f"{name} value: {value:.6E} | {name} PPL: {math.exp(min(20.0, value)):.6E} | "
    rule = "-" * (len(text) + 1)
    return [rule, text, rule]


def report_validation(label, iteration, losses):
    """Megatron's validation block on the console/log, and TensorBoard (and W&B) scalars."""
    for line in validation_lines(label, losses):
        get_logger().info(line)
    writer = get_scalar_writer()
    if writer is not None:
        for name, value in losses.items():
            writer.add_scalar(f"{name} validation", value, iteration)
            writer.add_scalar(f"{name} validation ppl", math.exp(min(20.0, value)), iteration)


def report_metrics(label, iteration, metrics, split="validation"):
    """A finetuning evaluation: `metrics` {name: float} on one line and in TensorBoard."""
    get_logger().info(f" {label} | " + " | ".join(f"{k}: {v:.6f}" for k, v in metrics.items()) + " |")
    writer = get_scalar_writer()
    if writer is not None:
        for name, value in metrics.items():
            writer.add_scalar(f"{split} {name}", value, iteration)


class Reporter:
    """Accumulates per-iteration results and writes the log line every `log_interval` iterations."""

    def __init__(self, args, train_iters, start_iteration=0, unit="tokens", flops_per_sample=None):
        """`flops_per_sample`: with --log-throughput, the FLOPs of one sample's training (all ranks together)."""
        self.args, self.unit = args, unit
        self.decoupled_lr = getattr(args, "decoupled_lr", None) is not None    # rates[1] is its rate
        self.flops_per_sample = flops_per_sample
        self.timers = get_timers()
        self.train_iters = train_iters
        self.writer = get_scalar_writer()
        self.logger = get_logger()
        self.bar = tqdm(total=train_iters, initial=start_iteration, desc="training", unit="it",
                        disable=args.no_progress_bar or not is_console_rank(), file=sys.stderr,
                        dynamic_ncols=True)
        self._reset()
        self.grad_norm = self.num_zeros = None
        self.intervals_logged = 0

    def _reset(self):
        self.loss_sum, self.iters, self.advanced, self.skipped, self.nan, self.seconds = {}, 0, 0, 0, 0, 0.0
        self.samples = self.units = 0

    def iteration(self, iteration, consumed_samples, losses, rates, step, seconds, units, global_batch_size=None):
        """Record one training iteration (`losses`: {name: value}; `rates`: the learning rate of each
        group (the decoupled one second with --decoupled-lr); `step`: its rapidgpt.training.step.StepResult;
        `global_batch_size`: its samples, default --global-batch-size: less on a --rampup-batch-size
        ramp); log when the interval is full.

        As Megatron's training_log: a skipped iteration (overflow, NaN) counts in "number of
        skipped iterations", its loss is not averaged (the bar shows "skipped" instead of it), and
        it is a "nan iteration" when the loss itself is not finite; the grad norm shown is the last
        update's, and so is the number of zeros (--log-num-zeros-in-grad); the params norm
        (--log-params-norm) is this iteration's."""
        gbs = global_batch_size or self.args.global_batch_size
        self.iters += 1
        self.seconds += seconds
        self.samples, self.units = self.samples + gbs, self.units + units
        if step.updated:
            self.advanced += 1
            for name, value in losses.items():
                self.loss_sum[name] = self.loss_sum.get(name, 0.0) + value
            self.grad_norm, self.num_zeros = step.grad_norm, step.num_zeros
            self.bar.set_postfix({name: f"{value:.3f}" for name, value in losses.items()}, refresh=False)
        else:
            self.skipped += 1
            self.nan += int(not all(math.isfinite(v) for v in losses.values()))
            self.bar.set_postfix_str("skipped", refresh=False)     # as in the log line: no loss
        self.bar.update(1)
        if self.writer is not None and iteration % self.args.tensorboard_log_interval == 0:
            self.writer.add_scalar("learning-rate", rates[0], iteration)
            if self.decoupled_lr:
                self.writer.add_scalar("decoupled-learning-rate", rates[1], iteration)
            self.writer.add_scalar("batch-size", gbs, iteration)
            for name, value in losses.items():
                self.writer.add_scalar(name, value, iteration)
            self.writer.add_scalar("loss-scale", step.loss_scale, iteration)
            if self.args.log_memory_to_tensorboard:
                for name, value in memory_in_use().items():
                    self.writer.add_scalar(name, value, iteration)
            if step.updated:
                self.writer.add_scalar("grad-norm", step.grad_norm, iteration)
                if step.num_zeros is not None:
                    self.writer.add_scalar("num-zeros", step.num_zeros, iteration)
            if step.params_norm is not None:
                self.writer.add_scalar("params-norm", step.params_norm, iteration)
            self.writer.add_scalar(f"{self.unit}-per-second", units / max(seconds, 1e-9), iteration)
        if iteration % self.args.log_interval == 0 or iteration == self.train_iters:
            per_iter = self.seconds / self.iters
            averages = ({n: v / self.advanced for n, v in self.loss_sum.items()} if self.advanced else {})
            tflops = (None if self.flops_per_sample is None
                      else self.flops_per_sample * self.samples / (max(self.seconds, 1e-9) * 1e12 * self.args.world_size))
            if tflops is not None and self.writer is not None:
                self.writer.add_scalar("throughput", tflops, iteration)
            self.logger.info(training_log_line(
                iteration, self.train_iters, consumed_samples, per_iter * 1000.0, rates[0],
                gbs, averages, step.loss_scale, self.grad_norm if self.advanced else None,
                self.skipped, self.nan, self.units / max(self.seconds, 1e-9), self.unit, tflops,
                rates[1] if self.decoupled_lr else None, self.num_zeros if self.advanced else None, step.params_norm))
            if self.args.log_timers_to_tensorboard:     # a collective, as the timing block below
                if self.writer is not None and self.intervals_logged:      # the first holds the compile
                    self.writer.add_scalar("iteration-time", per_iter, iteration)
                self.timers.write(LOOP_TIMERS, self.writer, iteration, normalizer=self.iters)
            if self.args.timing_log_level >= 1:         # a collective: every rank logs here
                timing = self.timers.log(LOOP_TIMERS, normalizer=self.iters)
                if timing:
                    self.logger.info(timing)
            self.intervals_logged += 1
            self._reset()

    def close(self):
        self.bar.close()
        if self.writer is not None:
            # Not flush(): tensorboardX's flush writes only the events its writer thread has taken
            # off its queue (measured: the last iteration's scalars of a 24-iteration run were not
            # in the file). close() drains the queue; a later scalar (e.g. the final validation)
            # reopens the writer, in a new event file of the same folder.
            self.writer.close()
