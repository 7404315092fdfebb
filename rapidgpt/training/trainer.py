"""The template both Pretrainer and Finetuner are made of: hook checks, model/optimizer set-up,
and the training loop.

The loop, per iteration: take `num_micro_batches` micro-batches from the train iterator, stack
them, run the compiled step (training/step.py) with the scheduler's learning rate, advance the
scheduler by the global batch, report (Megatron log line, tqdm, TensorBoard), and evaluate every
`--eval-interval` iterations.
"""
import inspect
import re
import time

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from rapidgpt.config.compile_cache import StepGraphCache
from rapidgpt.config.pipeline_split import run_stage_layers
from rapidgpt.global_vars import get_args, get_logger, get_timers
from rapidgpt.models.distillation import DistillationModel, student_of
from rapidgpt.models.gpt import GPTModel
from rapidgpt.optim import build_lr_scheduler, learning_rates
from rapidgpt.optim.distributed_optimizer import PIECE_PREFIX
from rapidgpt.optim.mixed_precision import MAIN_PARAMS_PREFIX, wrap_optimizer
from rapidgpt.parallel.comm import AllGather, barrier, gather_over_ranks, sum_over_ranks
from rapidgpt.parallel.layers import check_tensor_parallel_model
from rapidgpt.parallel.pipeline import ModelChunks
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.parallel.state import (get_data_parallel_group, get_parallel_state, is_pipeline_first_stage,
                                     is_pipeline_last_stage)
from rapidgpt.theoretical_memory import shape_from_args, startup_line, training_flops
from rapidgpt.training.checkpoint_files import start_checkpoint
from rapidgpt.training.checkpointing import (ExitSignal, load_checkpoint, load_pretrained_weights,
                                             save_checkpoint)
from rapidgpt.training.hook_contract import HookContractError, check_returned
from rapidgpt.training.model_transforms import prepare_model
from rapidgpt.training.pipeline_schedules import PipelineEvalStep, PipelineTrainStep
from rapidgpt.training.replica_checks import ReplicaChecks
from rapidgpt.training.reporting import Reporter
from rapidgpt.training.rerun_state_machine import RerunStateMachine, this_device
from rapidgpt.training.step import EvalStep, TrainStep


def to_tensors(batch):
    """A collated micro-batch (dict/tuple of numpy arrays) as MindSpore tensors."""
    if isinstance(batch, dict):
        return {key: Tensor(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(Tensor(value) for value in batch)
    return Tensor(batch)


def stack_micro_batches(micro_batches):
    """n micro-batches -> one dict/tuple of tensors `[n, micro_batch, ...]` for the compiled step."""
    first = micro_batches[0]
    if isinstance(first, dict):
        return {key: Tensor(np.stack([mb[key] for mb in micro_batches])) for key in first}
    return tuple(Tensor(np.stack([mb[i] for mb in micro_batches])) for i in range(len(first)))


def hook(signature):
    """Marks a template method as a hook the user must override; `signature` is shown in errors."""
    def mark(function):
        function.__hook_signature__ = signature
        return function
    return mark


class Trainer:
    """Base of the templates: hooks are the methods marked with `@hook` in the subclasses."""

    # How the training log line names the loss and counts throughput (Megatron's pretraining
    # line: "lm loss", tokens per second). A loss function that returns statistics (Megatron's
    # `(loss, {name: value})`, e.g. BERT's "lm loss" and "sop loss") has those logged instead.
    loss_name = "lm loss"
    throughput_unit = "tokens"

    def __init__(self, engine=None):
        self.engine = engine
        self.args = get_args()
        self.logger = get_logger()
        self.timers = get_timers()
        self._gather = None
        self._rerun = None

    def check_hooks(self):
        """Every hook must be overridden; the error names the missing ones with their signature."""
        missing = [f"    def {name}{member.__hook_signature__}"
                   for name, member in inspect.getmembers(type(self))
                   if hasattr(member, "__hook_signature__")]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} must implement these hooks of {type(self).__mro__[1].__name__}:\n"
                + "\n".join(missing))

    def build_model(self, **provider_kwargs):
        """The model of model_optimizer_lr_scheduler_provider, checked, with RapidGPT's seeded,
        layout-independent values in the parameters its layers declare (before anything is
        compiled), transformed for the run's precision, ZeRO-3 and recompute (its ZeRO-3 units
        kept in `zero3_units` for the optimizer wrapper), and Megatron's parameter-count line; its
        optimizer and scheduler as returned."""
        self.timers("model-and-optimizer-setup").start()
        pipelined = get_parallel_state().pipeline_model_parallel_size > 1
        split = getattr(self.args, "pipeline_split", None)
        if split is not None and split.interleaved:
            model, optimizer, scheduler = self._provide_model_chunks(split, provider_kwargs)
        else:
            if pipelined:           # Megatron's model_provider(pre_process, post_process) contract
                provider_kwargs = dict(provider_kwargs, pre_process=is_pipeline_first_stage(),
                                       post_process=is_pipeline_last_stage())
            model, optimizer, scheduler = self._provide_model(provider_kwargs)
        if pipelined and not hasattr(model, "set_input_tensor"):
            raise HookContractError(
                f"--pipeline-model-parallel-size: the {type(model).__name__} from model_optimizer_lr_scheduler_provider "
                f"cannot be split into pipeline stages; build only the stage given by pre_process/post_process "
                f"and give the model Megatron's set_input_tensor (rapidgpt.models.GPTModel does both)")
        distillation = self.args.distillation
        if distillation is not None and not isinstance(model, DistillationModel):
            raise HookContractError(
                f"--export-kd-teacher-load: the {type(model).__name__} from model_optimizer_lr_scheduler_provider "
                f"has no teacher; wrap the GPT in rapidgpt.models.build_distillation_model and return rapidgpt.models."
                f"distillation_loss from run_forward_step (as user_scripts/pretrain_gpt.py does), or drop the flag")
        check_tensor_parallel_model(model)
        initialize_parameters(model, self.args.seed)
        count = sum(int(np.prod(p.shape)) for p in student_of(model).get_parameters())  # whole, before ZeRO-3
        self.zero3_units = prepare_model(model, self.args.precision, self.args.recompute, self.logger, self.args.jit,
                      compile_layers=pipelined, zero=self.args.zero)
        tp_rank, _, pp_rank = get_parallel_state().coordinates()
        self.logger.info(f" > number of parameters on (tensor, pipeline) model parallel rank "
                         f"({tp_rank}, {pp_rank}): {count}")
        gpt = isinstance(model.chunks[0] if isinstance(model, ModelChunks) else student_of(model), GPTModel)
        self.logger.info(startup_line(self.args, model.vocab_size if gpt else None, count))
        if distillation is not None:
            teacher_count = sum(int(np.prod(p.shape)) for p in model.teacher.get_parameters())
            self.logger.info(distillation.describe() + f"; the teacher has {teacher_count} parameters on this rank")
        if gpt and self.args.mla.enabled:
            self.logger.info(self.args.mla.describe())
        if pipelined and split is not None:
            self.logger.info(f" > pipeline split: {split.describe()}")
        self.timers("model-and-optimizer-setup").stop()
        return model, optimizer, scheduler

    def _provide_model(self, provider_kwargs):
        model, optimizer, scheduler = check_returned(
            self.model_optimizer_lr_scheduler_provider(**provider_kwargs), "model_optimizer_lr_scheduler_provider",
            ("model", "optimizer or None", "lr_scheduler or None"))
        if not isinstance(model, nn.Cell):
            raise HookContractError(f"model_optimizer_lr_scheduler_provider returned a {type(model).__name__} "
                                    f"as the model; it must be a mindspore.nn.Cell")
        return model, optimizer, scheduler

    def _provide_model_chunks(self, split, provider_kwargs):
        """The interleaved schedule: Megatron's model_provider(pre_process, post_process, vp_stage)
        called once per model chunk of this rank, the chunks held as one ModelChunks; the optimizer
        is built from the flags over all of them, the scheduler is the first call's."""
        pp_rank = get_parallel_state().coordinates()[2]
        parameters = inspect.signature(self.model_optimizer_lr_scheduler_provider).parameters.values()
        if not any(p.name == "vp_stage" or p.kind == p.VAR_KEYWORD for p in parameters):
            raise HookContractError(
                f"--num-virtual-stages-per-pipeline-rank {split.virtual_size}: the interleaved schedule builds "
                f"{split.virtual_size} model chunks per rank, but model_optimizer_lr_scheduler_provider takes no "
                f"vp_stage; add vp_stage=None and pass it to the model (rapidgpt.models.build_gpt_model does)")
        chunks, scheduler = [], None
        for vp_stage in range(split.virtual_size):
            kwargs = dict(provider_kwargs, pre_process=split.holds_embedding(pp_rank, vp_stage),
                          post_process=split.holds_loss(pp_rank, vp_stage), vp_stage=vp_stage)
            chunk, optimizer, chunk_scheduler = self._provide_model(kwargs)
            if optimizer is not None:
                raise HookContractError(
                    "model_optimizer_lr_scheduler_provider returned an optimizer, but under the interleaved "
                    "schedule it builds one model chunk per call; return None as the optimizer and RapidGPT "
                    "builds it from the flags over all chunks")
            chunks.append(chunk)
            scheduler = chunk_scheduler if vp_stage == 0 else scheduler
        return ModelChunks(chunks), None, scheduler

    def build_model_optimizer_scheduler(self, **provider_kwargs):
        """The user's model/optimizer/scheduler (`build_model`); None optimizer or scheduler are
        built from the flags. The optimizer comes back inside the run's OptimizerWrapper
        (rapidgpt/optim/mixed_precision.py)."""
        model, optimizer, scheduler = self.build_model(**provider_kwargs)
        if optimizer is not None and not hasattr(optimizer, "parameters"):
            raise HookContractError("the optimizer from model_optimizer_lr_scheduler_provider needs "
                                    "`parameters` and must be callable as optimizer(grads, lr); use "
                                    "rapidgpt.optim.AdamW/SGD or return None to build one from the flags")
        self.timers("model-and-optimizer-setup").start()
        optimizer = wrap_optimizer(optimizer, model, self.args, self.zero3_units)
        self.logger.info(optimizer.held_line())
        if scheduler is None:
            scheduler = build_lr_scheduler(self.args)
        self._check_lr_groups(optimizer, scheduler)
        self.timers("model-and-optimizer-setup").stop()
        return model, optimizer, scheduler

    def _check_lr_groups(self, optimizer, scheduler):
        """--decoupled-lr and --use-mup need an optimizer with a rate per group and a scheduler giving
        as many rates; the parameters of each group are logged."""
        mup = self.args.mup if getattr(self.args, "mup", None) and self.args.mup.enabled else None
        if mup:
            self.logger.info(mup.describe(self.args.optimizer))
        mup_lr_mult = mup.lr_mult(self.args.optimizer) if mup else None
        if self.args.decoupled_lr is None and mup_lr_mult is None:
            return
        inner = optimizer.optimizer
        wanted = 1 + (self.args.decoupled_lr is not None) + (mup_lr_mult is not None)
        if getattr(inner, "lr_slots", None) is None or inner.learning_rate.size != wanted \
                or len(learning_rates(scheduler)) != wanted:
            raise HookContractError(f"--decoupled-lr, --use-mup: the flags ask for {wanted} learning rates (--lr's, "
                                    f"the decoupled one, muP's), which the optimizer or scheduler from model_optimizer_"
                                    f"lr_scheduler_provider does not give; build rapidgpt.optim.AdamW/SGD with "
                                    f"decoupled_lr and mup_width_mult as the flags say and rapidgpt.optim."
                                    f"build_lr_scheduler(args), or return None for either to build it from the flags")

        def names(slot):          # every layer's alike: "layers.*.mlp.dense_h_to_4h.weight"
            found = sorted({re.sub(r"(^|\.)layers\.\d+\.", r"\1layers.*.",
                                   p.name.removeprefix(MAIN_PARAMS_PREFIX).removeprefix(PIECE_PREFIX))
                            for p, own in zip(inner.parameters, inner.lr_slots) if own == slot})
            return ', '.join(found) if found else 'no parameter of this pipeline stage'
        if self.args.decoupled_lr is not None:
            self.logger.info(f" > --decoupled-lr {self.args.decoupled_lr:g} for {names(1)}")
        if mup_lr_mult is not None:
            self.logger.info(f" > muP's lr x{mup_lr_mult:g} for {names(wanted - 1)}")

    def load_checkpoint_if_asked(self):
        """Megatron's start: resume from --load when it holds a checkpoint, else take the model
        weights of --pretrained-checkpoint (parameters it lacks keep their fresh initialisation).
        Returns (iteration, consumed samples) to continue from."""
        self.timers("load-checkpoint").start()
        try:
            return self._load_checkpoint_if_asked()
        finally:
            self.timers("load-checkpoint").stop()

    def _load_checkpoint_if_asked(self):
        if isinstance(self.model, DistillationModel):
            self.model.load_teacher(self.logger)
        flag, _ = start_checkpoint(self.args)
        if flag is None and self.args.load:
            self.logger.warning(f"WARNING: no checkpoint under --load {self.args.load}: starting from "
                                f"scratch (iteration 0)")
        if flag == "--pretrained-checkpoint":
            if self.args.load:
                self.logger.info(f" no checkpoint under --load {self.args.load} yet: starting from "
                                 f"--pretrained-checkpoint")
            load_pretrained_weights(self.args.pretrained_checkpoint, student_of(self.model), self.logger,
                                    self.optimizer, run_stage_layers(self.args))
        if flag != "--load":
            return 0, 0
        iteration, consumed = load_checkpoint(self.args, student_of(self.model), self.optimizer, self.lr_scheduler,
                                              self.logger, rerun=self.rerun_machine())
        self.logger.info(f" loaded checkpoint from {self.args.load} at iteration {iteration}"
                         + (" (--finetune: weights only, starting at iteration 0)" if self.args.finetune else ""))
        return iteration, consumed

    def rerun_machine(self):
        """The run's rerun state machine (--rerun-mode; rapidgpt/training/rerun_state_machine.py)."""
        if self._rerun is None:
            state = get_parallel_state()
            self._rerun = RerunStateMachine(self.args.rerun, self.args.seed, state.rank, state.world_size, self.logger,
                                            this_device(state.rank), gather_over_ranks,
                                            lambda flag: sum_over_ranks(int(flag)) > 0)
        return self._rerun

    def save(self, iteration, consumed):
        self.timers("save-checkpoint").start()
        path = save_checkpoint(self.args, iteration, consumed, student_of(self.model), self.optimizer,
                               self.lr_scheduler,
                               rerun_state=self.rerun_machine().state_dict())
        self.timers("save-checkpoint").stop()
        self.logger.info(f"  successfully saved checkpoint at iteration {iteration:7d} to {path}")
        self.logger.info(self.timers.log(["save-checkpoint"]))

    def _exit_reason(self, iteration, started, exit_signal):
        """Why training stops after `iteration` (None: it goes on). All ranks stop at the same
        step, because the save is collective: a signal or time limit any rank sees stops them all."""
        args = self.args
        reason = None
        if exit_signal.received:
            reason = f"received {exit_signal.received}"
        elif args.exit_interval and iteration % args.exit_interval == 0:
            reason = f"--exit-interval {args.exit_interval}"
        elif args.exit_duration_in_mins and time.time() - started > 60 * args.exit_duration_in_mins:
            reason = f"--exit-duration-in-mins {args.exit_duration_in_mins}"
        stopping = sum_over_ranks(int(reason is not None))
        if stopping and reason is None:
            reason = f"{stopping} other rank(s) stopping (a signal or --exit-duration-in-mins)"
        return reason

    def train_loop(self, model, optimizer, scheduler, forward, train_batches, train_iters,
                   evaluate=None, eval_interval=None, start_iteration=0, consumed=0):
        """Iterations `start_iteration+1 .. train_iters`; `evaluate(iteration)` every `eval_interval`.

        Saves every --save-interval and at the end (with --save). On SIGTERM/SIGINT,
        --exit-interval or --exit-duration-in-mins it saves at the step boundary and returns
        False (training did not finish); otherwise True. An iteration of --iterations-to-skip reads
        and drops its micro-batches and counts its samples as consumed, as Megatron's
        dummy_train_step: no step, no LR schedule step, no log line of Megatron's, evaluation or
        save there.
        """
        args, timers = self.args, self.timers
        rampup = getattr(args, "batch_size_rampup", None)
        steps = {}

        def step_of(n):
            """The compiled step of n micro-batches (one, unless --rampup-batch-size changes n)."""
            if n not in steps:
                steps[n] = self.train_step(forward, model, optimizer, n, first=not steps)
                if len(steps) == 1:
                    self.logger.info(f" > gradients handed to the optimizer on this rank: "
                                     f"{steps[n].gradient_bytes} bytes")
            return steps[n]

        rerun = self.rerun_machine()
        replicas = ReplicaChecks(args, model, get_parallel_state())
        for line in replicas.describe():
            self.logger.info(line)
        reporter = Reporter(args, train_iters, start_iteration, self.throughput_unit,
                            self.flops_per_sample(model) if args.log_throughput else None)
        model.set_train(True)
        started, iteration, saved = time.time(), start_iteration, True
        gbs = args.global_batch_size
        try:
            with ExitSignal() as exit_signal:
                for iteration in range(start_iteration + 1, train_iters + 1):
                    if rampup is not None:
                        gbs = self._ramped_batch_size(rampup, consumed, gbs if iteration > start_iteration + 1 else None)
                    n = args.num_micro_batches if rampup is None else gbs // rampup.per_micro_batch
                    if iteration in args.iterations_to_skip:
                        for _ in range(n):
                            next(train_batches)
                        consumed += gbs
                        self.logger.info(f" > iteration {iteration} skipped (--iterations-to-skip): its {gbs} "
                                         f"samples consumed without a step")
                        continue
                    step = step_of(n)
                    start = time.perf_counter()
                    timers("batch-generator", log_level=1).start()
                    stacked = stack_micro_batches([next(train_batches) for _ in range(n)])
                    timers("batch-generator", log_level=1).stop()
                    timers("forward-backward-optimizer", log_level=1).start()
                    rates = learning_rates(scheduler)
                    rates = rates[0] if len(rates) == 1 else rates
                    outcome = rerun.run_step(iteration, lambda validation: step(stacked, rates, iteration, validation))
                    timers("forward-backward-optimizer", log_level=1).stop()
                    if outcome.exit_code is not None:
                        self._stop_for_rerun(outcome, iteration, consumed)
                    result = outcome.result
                    if result.updated:          # a skipped step does not advance the LR schedule
                        scheduler.step(gbs)
                    replicas.after_iteration(iteration)
                    consumed += gbs
                    reporter.iteration(iteration, consumed, result.stats or {self.loss_name: result.loss},
                                       learning_rates(scheduler), result, time.perf_counter() - start,
                                       gbs * (args.seq_length if self.throughput_unit == "tokens" else 1), gbs)
                    if evaluate is not None and eval_interval and iteration % eval_interval == 0:
                        self._evaluate_in_eval_mode(model, evaluate, iteration)
                    saved = bool(args.save and args.save_interval and iteration % args.save_interval == 0)
                    if saved:
                        self.save(iteration, consumed)
                    reason = self._exit_reason(iteration, started, exit_signal)
                    if reason:
                        if args.save and not saved:
                            self.save(iteration, consumed)
                        self.logger.info(f" exiting at iteration {iteration}: {reason}")
                        return False
        finally:
            reporter.close()
        if args.save and not saved and iteration > start_iteration:
            self.save(iteration, consumed)
        return True

    def _stop_for_rerun(self, outcome, iteration, consumed):
        """The rerun state machine stops the run at `iteration`: with the checkpoint of the
        iteration before when it asks for one (to re-run this one from), then exit its code."""
        if outcome.save and self.args.save:
            self.save(iteration - 1, consumed)
        elif outcome.save:
            self.logger.error(f"no --save: the checkpoint of iteration {iteration - 1} to re-run iteration {iteration} "
                              f"from on another device cannot be written")
        self.logger.info(f" exiting at iteration {iteration} with code {outcome.exit_code} (--rerun-mode)")
        raise SystemExit(outcome.exit_code)

    def train_step(self, forward, model, optimizer, n, first=True):
        """The compiled training step of `n` micro-batches: the 1F1B pipeline with pipeline stages,
        else one graph (read from the compile cache when `first`: the first graph of the run)."""
        args = self.args
        in_fp32 = args.precision.accumulate_allreduce_grads_in_fp32
        if args.pipeline_model_parallel_size > 1:
            split = args.pipeline_split
            return PipelineTrainStep(forward, model, optimizer, n, self.activation_shape(), in_fp32, jit=args.jit,
                                     per_token=args.calculate_per_token_loss, virtual_size=split.virtual_size,
                                     group_size=split.microbatch_group_size)
        frozen = [p.name for p in model.get_parameters() if not p.requires_grad]
        cache = (StepGraphCache(args, optimizer.parameters, get_parallel_state().rank, frozen)
                 if first and args.compile_cache_config.enabled else None)
        return TrainStep(forward, optimizer, n, in_fp32, jit=args.jit, compile_cache=cache,
                         barrier=barrier if args.world_size > 1 else None, per_token=args.calculate_per_token_loss)

    def _ramped_batch_size(self, rampup, consumed, previous):
        """--rampup-batch-size: the global batch size after `consumed` samples, with Megatron's lines
        when it is set (`previous` None: the run's first iteration) or changes."""
        gbs = rampup.batch_size_at(consumed)
        if previous is None:
            self.logger.info(f" > setting initial batch size to {gbs} ({rampup.describe()})")
        elif gbs != previous:
            self.logger.info(f" > ramping up batch size from {previous} to {gbs}")
        return gbs

    def log_setup_times(self):
        """Megatron's start-up report: the set-up phases' times, before training starts."""
        text = self.timers.log(["model-and-optimizer-setup", "train/valid/test-data-iterators-setup",
                                "load-checkpoint"])
        if text:
            self.logger.info(text)

    def _evaluate_in_eval_mode(self, model, evaluate, iteration):
        self.timers("evaluate", log_level=1).start()
        model.set_train(False)
        try:
            evaluate(iteration)
        finally:
            model.set_train(True)
            self.timers("evaluate", log_level=1).stop()

    def eval_step(self, forward, model=None):
        """A compiled forward-only `micro_batch -> (loss, {name: statistic})` over this trainer's
        forward hook (the `model` it runs is needed with pipeline stages)."""
        if self.args.pipeline_model_parallel_size > 1:
            return PipelineEvalStep(forward, model, self.activation_shape(),
                                    getattr(ms, self.args.precision.storage_dtype), self.args.calculate_per_token_loss,
                                    self.args.pipeline_split.virtual_size)
        return EvalStep(forward, jit=self.args.jit, barrier=barrier if self.args.world_size > 1 else None,
                        per_token=self.args.calculate_per_token_loss)

    def flops_per_sample(self, model):
        """--log-throughput: Megatron's FLOPs of training on one sample, from the model flags (its
        formula is the GPT's, used for any model as Megatron does; linear in the batch size) and the
        model's or the flags' vocabulary."""
        vocab = getattr(model, "vocab_size", None) or self.args.vocab_size or 0
        return training_flops(shape_from_args(self.args, vocab), 1)

    def activation_shape(self):
        """What pipeline stages send each other: `[micro batch, seq length, hidden size]` (with
        --sequence-parallel each TP rank's part of the sequence)."""
        parts = self.args.tensor_model_parallel_size if self.args.sequence_parallel else 1
        return (self.args.micro_batch_size, self.args.seq_length // parts, self.args.hidden_size)

    def gather(self, values):
        """Metric values `[n, ...]` from every data-parallel rank, concatenated in DP-rank order
        (n may differ between ranks: the last evaluation batch can be short or missing)."""
        values = np.asarray(values)
        group = get_data_parallel_group()
        if group is None:
            return values
        if self._gather is None:
            self._gather = AllGather(group, axis=0)
        # As fp32, the dtype every backend can all-reduce (exact for ints below 2^24: labels,
        # predictions, counts); padded to the longest rank's n, then trimmed.
        counts = self._gather(Tensor(np.array([len(values)], np.float32))).asnumpy().astype(int)
        padded = np.zeros((counts.max(),) + values.shape[1:], np.float32)
        padded[:len(values)] = values
        gathered = self._gather(Tensor(padded)).asnumpy().reshape((len(counts), counts.max()) + values.shape[1:])
        return np.concatenate([g[:n] for g, n in zip(gathered, counts)]).astype(values.dtype)

