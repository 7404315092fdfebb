"""RapidGPTEngine: prepares this process for training, once.

Parses and validates the flags (unless given a namespace), selects the device and MindSpore's
execution mode, seeds python/numpy/MindSpore, records the parallel layout, builds the tokenizer
and the logger/TensorBoard writer that `get_args()`, `get_tokenizer()`, `get_logger()` return.
`compose()` gives a hand-written loop the engine's compiled, clipped, scheduled update.
"""
import os
import random

import mindspore as ms
import numpy as np

from rapidgpt.arguments import parse_args
from rapidgpt.flag_parser import ArgumentError
from rapidgpt.global_vars import get_logger, set_global_variables
from rapidgpt.mindspore_logs import records_line
from rapidgpt.config.compile_cache import check_compile_cache_environment, describe_compile_cache
from rapidgpt.config.implementation_choices import implementation_choice_lines
from rapidgpt.config.kernel_fusion import check_kernel_fusion_backend, enable_kernel_fusion
from rapidgpt.device import ensure_device, select_device
from rapidgpt.optim import build_lr_scheduler
from rapidgpt.optim.mixed_precision import wrap_optimizer
from rapidgpt.parallel import comm
from rapidgpt.parallel.layers import check_tensor_parallel_model
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.parallel.state import ParallelState, initialize_parallel_state
from rapidgpt.tokenizer import build_tokenizer
from rapidgpt.tokenizer import TOKENIZER_FILE_ARGS
from rapidgpt.training.checkpoint_files import remember_tokenizer_files
from rapidgpt.training.compose import ComposedOptimizer
from rapidgpt.training.model_transforms import prepare_model

_THREADS_SET = False


def set_seeds(seed):
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)


class RapidGPTEngine:
    def __init__(self, extra_args_provider=None, argv=None, args=None):
        global _THREADS_SET
        self.args = args if args is not None else parse_args(extra_args_provider, argv)
        args = self.args
        self.device = select_device(args.device)
        args.precision = args.precision.on_device(self.device)
        problem = (check_kernel_fusion_backend(args.kernel_fusion, self.device)
                   or check_compile_cache_environment())
        if problem:
            raise ArgumentError(problem)
        if not comm.initialized():          # the rapidgpt CLI sets it before joining msrun's job
            ensure_device(self.device)
        ms.set_context(mode=ms.PYNATIVE_MODE)
        if self.device == "cpu" and not _THREADS_SET:
            # MindSpore's CPU kernels use this many threads (OMP_NUM_THREADS has no effect); by
            # default this node's processes share its cores rather than each taking all of them.
            local_processes = max(1, args.world_size // args.nnodes)
            ms.device_context.cpu.op_tuning.threads_num(
                args.cpu_threads or max(1, (os.cpu_count() or 1) // local_processes))
            _THREADS_SET = True
        set_seeds(args.seed)
        rank, world_size = comm.init_distributed(self.device)
        if world_size != args.world_size:
            raise RuntimeError(f"the flags were validated for {args.world_size} processes, but this job "
                               f"has {world_size}")
        self.parallel_state = state = ParallelState(
            world_size=world_size, rank=rank, tensor_model_parallel_size=args.tensor_model_parallel_size,
            pipeline_model_parallel_size=args.pipeline_model_parallel_size)
        split = getattr(args, "pipeline_split", None)
        ring = split is not None and split.interleaved
        initialize_parallel_state(state, groups=self._groups(state, ring) if world_size > 1 else None)
        self.tokenizer = build_tokenizer(args) if args.tokenizer_type else None
        # Checkpoints embed the tokenizer files; read now, they are saved even if their source
        # (e.g. a checkpoint this run resumed from) is pruned or deleted later.
        remember_tokenizer_files({key: getattr(args, key) for key in TOKENIZER_FILE_ARGS})
        set_global_variables(args, self.tokenizer, rank=rank)
        get_logger().info(f" > graph kernel fusion: {enable_kernel_fusion(args.kernel_fusion, self.device, rank)}")
        get_logger().info(f" > compile cache: {describe_compile_cache(args)}")
        if records_line(rank):
            get_logger().info(records_line(rank))
        for line in implementation_choice_lines(args):
            get_logger().info(line)

    @staticmethod
    def _groups(state, ring=False):
        """This rank's communication groups (every member creates each; the neighbour pairs in
        stage order, so that each pair's two members create it at matching moments; with `ring`,
        the interleaved schedule's, the last and first stages' own pair after them)."""
        prev, nxt = state.pipeline_pairs()
        groups = {"tensor": comm.new_group(state.tensor_parallel_ranks()),
                  "data": comm.new_group(state.data_parallel_ranks()),
                  "pipeline": comm.new_group(state.pipeline_parallel_ranks()),
                  "model": comm.new_group(state.model_parallel_ranks())}
        embedding = state.embedding_ranks()
        groups["embedding"] = comm.new_group(embedding) if state.rank in embedding else None
        groups["pipeline_prev"] = comm.new_group(prev) if prev else None
        groups["pipeline_next"] = comm.new_group(nxt) if nxt else None
        wrap = state.pipeline_wrap_pair() if ring else None
        groups["pipeline_wrap"] = comm.new_group(wrap, purpose="ring") if wrap else None
        return groups

    def compose(self, model, optimizer=None, lr_scheduler=None, train_dataloader=None):
        """Rapidformer's no-trainer mode for a hand-written loop.

        Returns `(model, optimizer, lr_scheduler, train_dataloader)`: the model with RapidGPT's
        seeded initialisation, transformed for the precision and recompute flags, in training mode;
        an optimizer whose `step(forward_fn, *inputs)` runs the compiled
        forward/backward/unscale/clip/update at the scheduler's learning rate and returns the loss
        (`optimizer.last_updated` is False after a skipped step: do not advance the scheduler then,
        as Megatron); and the scheduler (built from the flags when None; advance it with
        `lr_scheduler.step(samples)`).
        """
        if self.args.pipeline_model_parallel_size > 1:
            raise ArgumentError(f"--pipeline-model-parallel-size {self.args.pipeline_model_parallel_size}: "
                                f"engine.compose runs a hand-written loop without pipeline stages; use a "
                                f"Pretrainer for pipeline parallelism")
        if self.args.rampup_batch_size is not None:
            raise ArgumentError("--rampup-batch-size: engine.compose steps the batches the hand-written loop "
                                "passes; use a Pretrainer for the ramp")
        if lr_scheduler is None and not self.args.train_iters:
            raise ArgumentError("--train-iters: engine.compose builds the LR schedule, which decays over "
                                "--train-iters (or --train-samples); give one, or pass your lr_scheduler")
        check_tensor_parallel_model(model)
        initialize_parameters(model, self.args.seed)
        zero3_units = prepare_model(model, self.args.precision, self.args.recompute, get_logger(), self.args.jit,
                      zero=self.args.zero)
        model.set_train(True)          # MindSpore cells start in eval mode (no dropout)
        optimizer = wrap_optimizer(optimizer, model, self.args, zero3_units)
        get_logger().info(optimizer.held_line())
        lr_scheduler = lr_scheduler or build_lr_scheduler(self.args)
        return model, ComposedOptimizer(optimizer, lr_scheduler, self.args), lr_scheduler, train_dataloader
