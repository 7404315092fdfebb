"""Which decoder layers each pipeline stage holds: Megatron's flags for uneven stages and the
interleaved schedule's virtual stages, their checks, and `PipelineSplit`, the one object that
answers "which layers does (pipeline rank p, virtual stage v) build".

    --decoder-first-pipeline-num-layers N     the first stage holds N layers (the rest split evenly)
    --decoder-last-pipeline-num-layers N      the last stage holds N layers
    --account-for-embedding-in-pipeline-split count the embedding as a layer of the first stage
    --account-for-loss-in-pipeline-split      count the output layer and loss as one of the last stage
    --num-layers-per-virtual-pipeline-stage N each rank holds several model chunks of N layers
    --num-virtual-stages-per-pipeline-rank V  ... or V chunks per rank (the only form with uneven stages)
    --microbatch-group-size-per-virtual-pipeline-stage G   the interleaved schedule's micro-batch
                                              group (default P: Megatron's depth-first order)

Megatron-core's rule (get_num_layers_to_build and get_transformer_layer_offset): a rank's layer
count (uneven first/last, or (L + embedding + loss) / P) divided by V is each of its chunks'
count, less one for the chunk holding the embedding (first rank, chunk 0) or the loss (last rank,
last chunk) when they are counted; the virtual stages s = v * P + p hold consecutive blocks in the
order of s (tests/test_pipeline.py checks this against a port of Megatron's offsets). Every layer
keeps its global name (`layers.5....`), so checkpoints, seeded initialisation and dropout masks do
not depend on the split.
"""
from dataclasses import dataclass


def add_pipeline_split_args(parser):
    g = parser.add_argument_group("pipeline split (Megatron's uneven stages and interleaved schedule)")
    g.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None,
                   help="layers of the first pipeline stage; the others split the rest evenly")
    g.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None,
                   help="layers of the last pipeline stage; the others split the rest evenly")
    g.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                   help="count the embedding as one layer of the first stage when splitting")
    g.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                   help="count the output layer and loss as one layer of the last stage when splitting")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None,
                   help="the interleaved 1F1B schedule: each rank holds model chunks of this many layers")
    g.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, default=None,
                   help="the interleaved 1F1B schedule: this many model chunks per rank")
    g.add_argument("--microbatch-group-size-per-virtual-pipeline-stage", type=int, default=None,
                   help="micro-batches run per model chunk before the next chunk (interleaved schedule; "
                        "default the pipeline size)")


@dataclass(frozen=True)
class PipelineSplit:
    """The layers of every (pipeline rank, virtual stage). `virtual_size` V is 1 without the
    interleaved schedule; `first_layers`/`last_layers` None unless uneven."""
    num_layers: int
    pp_size: int
    virtual_size: int = 1
    first_layers: int = None
    last_layers: int = None
    account_for_embedding: bool = False
    account_for_loss: bool = False
    microbatch_group_size: int = None

    @property
    def interleaved(self):
        return self.virtual_size > 1

    def problems(self):
        """What is wrong with this split, as one-line messages naming the flags (empty: fine)."""
        found = []
        uneven = self.first_layers is not None or self.last_layers is not None
        if uneven and (self.account_for_embedding or self.account_for_loss):
            found.append("--decoder-first/last-pipeline-num-layers cannot be combined with "
                         "--account-for-embedding/loss-in-pipeline-split (Megatron's rule); keep one way of "
                         "splitting")
            return found
        if uneven:
            for flag, n in (("--decoder-first-pipeline-num-layers", self.first_layers),
                            ("--decoder-last-pipeline-num-layers", self.last_layers)):
                if n is not None and n <= 0:
                    found.append(f"{flag}: must be positive, got {n}")
                elif n is not None and n % self.virtual_size:
                    found.append(f"{flag}: {n} layers cannot be cut into the {self.virtual_size} model chunks "
                                 f"of the interleaved schedule; give a multiple of {self.virtual_size}")
            if found:
                return found
            middle_layers, middle_stages = self._middle()
            if bool(middle_layers) != bool(middle_stages) or middle_layers < 0:
                found.append(f"--decoder-first/last-pipeline-num-layers: {middle_layers} layers are left for "
                             f"{middle_stages} middle stages of --pipeline-model-parallel-size {self.pp_size}; "
                             f"make them fit --num-layers {self.num_layers}")
            elif middle_stages and middle_layers % (middle_stages * self.virtual_size):
                found.append(f"--decoder-first/last-pipeline-num-layers: the {middle_layers} remaining layers "
                             f"cannot be split evenly into {middle_stages} middle stages"
                             + (f" of {self.virtual_size} model chunks" if self.interleaved else "")
                             + "; change the first/last stage's layers or the stage count")
            return found
        counted = self.counted_layers()
        if counted % self.pp_size:
            extra = " (with the embedding/loss counted as layers)" if counted != self.num_layers else ""
            found.append(f"--pipeline-model-parallel-size: --num-layers {self.num_layers}{extra} cannot be split into "
                         f"{self.pp_size} equal stages; choose a stage count that divides the layers, or set "
                         f"--decoder-first/last-pipeline-num-layers")
        elif (counted // self.pp_size) % self.virtual_size:
            found.append(f"--num-virtual-stages-per-pipeline-rank: the {counted // self.pp_size} layers of a stage "
                         f"cannot be cut into {self.virtual_size} model chunks")
        elif any(self.chunk_layer_count(p, v) < 0 for p in (0, self.pp_size - 1) for v in range(self.virtual_size)):
            found.append("--account-for-embedding/loss-in-pipeline-split: a model chunk would hold fewer than no "
                         "layers; give more layers or fewer stages")
        return found

    def _middle(self):
        layers, stages = self.num_layers, self.pp_size
        for n in (self.first_layers, self.last_layers):
            if n is not None:
                layers, stages = layers - n, stages - 1
        return layers, stages

    def counted_layers(self):
        """The decoder layers, plus the embedding and the loss where they count as layers."""
        return self.num_layers + int(self.account_for_embedding) + int(self.account_for_loss)

    def chunk_layer_count(self, pp_rank, vp_stage):
        """How many decoder layers virtual stage `vp_stage` of rank `pp_rank` builds."""
        if self.first_layers is not None and pp_rank == 0:
            per_rank = self.first_layers
        elif self.last_layers is not None and pp_rank == self.pp_size - 1:
            per_rank = self.last_layers
        elif self.first_layers is not None or self.last_layers is not None:
            layers, stages = self._middle()
            per_rank = layers // stages if stages else 0
        else:
            per_rank = self.counted_layers() // self.pp_size
        count = per_rank // self.virtual_size
        if self.account_for_embedding and (pp_rank, vp_stage) == (0, 0):
            count -= 1
        if self.account_for_loss and (pp_rank, vp_stage) == (self.pp_size - 1, self.virtual_size - 1):
            count -= 1
        return count

    def layer_range(self, pp_rank, vp_stage=0):
        """The global indices of the layers of (pp_rank, vp_stage): the blocks follow each other in
        the order of the virtual stages v * P + p."""
        before = sum(self.chunk_layer_count(p, v) for v in range(self.virtual_size) for p in range(self.pp_size)
                     if v * self.pp_size + p < vp_stage * self.pp_size + pp_rank)
        return range(before, before + self.chunk_layer_count(pp_rank, vp_stage))

    def stage_layers(self):
        """Each pipeline rank's layers (all of its chunks'), in rank order: what a checkpoint
        records of the split (rapidgpt/training/checkpointing.py)."""
        return [sorted(i for v in range(self.virtual_size) for i in self.layer_range(p, v))
                for p in range(self.pp_size)]

    def holds_embedding(self, pp_rank, vp_stage):
        return (pp_rank, vp_stage) == (0, 0)

    def holds_loss(self, pp_rank, vp_stage):
        return (pp_rank, vp_stage) == (self.pp_size - 1, self.virtual_size - 1)

    def describe(self):
        counts = [[self.chunk_layer_count(p, v) for v in range(self.virtual_size)] for p in range(self.pp_size)]
        stages = " | ".join("+".join(map(str, chunks)) for chunks in counts)
        schedule = (f"interleaved 1F1B, {self.virtual_size} model chunks per rank"
                    if self.interleaved else "1F1B")
        return f"layers per stage {stages} ({schedule})"


def pipeline_split_from_args(args):
    """The run's PipelineSplit (Megatron's arguments.py derivation of the virtual size)."""
    pp = args.pipeline_model_parallel_size or 1
    virtual = 1
    if pp > 1 and args.num_virtual_stages_per_pipeline_rank is not None:
        virtual = args.num_virtual_stages_per_pipeline_rank
    elif pp > 1 and args.num_layers_per_virtual_pipeline_stage:
        counted = (args.num_layers + int(args.account_for_embedding_in_pipeline_split)
                   + int(args.account_for_loss_in_pipeline_split))
        virtual = max(1, counted // pp // args.num_layers_per_virtual_pipeline_stage)
    return PipelineSplit(args.num_layers, pp, virtual, args.decoder_first_pipeline_num_layers,
                         args.decoder_last_pipeline_num_layers, args.account_for_embedding_in_pipeline_split,
                         args.account_for_loss_in_pipeline_split,
                         args.microbatch_group_size_per_virtual_pipeline_stage or pp)


def check_pipeline_split_args(args, check):
    """Megatron's checks of the split flags, each one line; sets `args.pipeline_split` (None before
    the layer count is known)."""
    args.pipeline_split = None
    pp = args.pipeline_model_parallel_size or 1
    per_stage, stages = args.num_layers_per_virtual_pipeline_stage, args.num_virtual_stages_per_pipeline_rank
    uneven = args.decoder_first_pipeline_num_layers is not None or args.decoder_last_pipeline_num_layers is not None
    ok = check.require(per_stage is None or stages is None,
                       "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank: give one")
    ok &= check.require(per_stage is None or per_stage > 0,
                        f"--num-layers-per-virtual-pipeline-stage: must be positive, got {per_stage}")
    ok &= check.require(stages is None or stages > 0,
                        f"--num-virtual-stages-per-pipeline-rank: must be positive, got {stages}")
    ok &= check.require(per_stage is None or not uneven,
                        "--num-layers-per-virtual-pipeline-stage: with --decoder-first/last-pipeline-num-layers "
                        "give the chunk count as --num-virtual-stages-per-pipeline-rank (Megatron's rule)")
    if not args.num_layers or not ok:
        return
    split = args.pipeline_split = pipeline_split_from_args(args)
    if pp == 1:
        check.require(per_stage is None and stages is None and not uneven
                      and not args.account_for_embedding_in_pipeline_split and not args.account_for_loss_in_pipeline_split,
                      "--pipeline-model-parallel-size 1: the pipeline split flags (virtual stages, uneven stages, "
                      "embedding/loss counted as layers) need pipeline stages; drop them or set the stage count")
        return
    if per_stage is not None:
        counted = split.counted_layers()
        ok = check.require(counted % pp == 0 and (counted // pp) % per_stage == 0,
                           f"--num-layers-per-virtual-pipeline-stage: {per_stage} does not divide the "
                           f"{counted / pp:g} layers of each of the {pp} stages; choose a divisor")
    for problem in split.problems() if ok else ():
        check.add(problem)
    if split.interleaved:
        group = split.microbatch_group_size
        check.require(group >= pp, f"--microbatch-group-size-per-virtual-pipeline-stage: {group} is below the "
                                   f"pipeline size {pp}; Megatron's interleaved schedule needs at least {pp}")


def check_interleaved_micro_batches(pp, group, m):
    """Megatron's conditions on the micro-batch count `m` of an interleaved step of `pp` stages with
    micro-batch groups of `group` -> a message, or None."""
    if group > m:
        return (f"--microbatch-group-size-per-virtual-pipeline-stage {group}: the interleaved schedule runs "
                f"groups of {group} micro-batches but a step has {m} (global batch / (micro batch x data-parallel "
                f"size)); give a larger --global-batch-size or a smaller group (at least the pipeline size {pp})")
    if 0 < m % group < pp:
        return (f"--global-batch-size: the {m} micro-batches of a step leave a last group of {m % group} "
                f"(--microbatch-group-size-per-virtual-pipeline-stage {group}); Megatron's interleaved "
                f"schedule needs it empty or at least the pipeline size {pp}")
    return None


def pipeline_split_of(config, pp_size, vp_stage=None):
    """The split a model built from `config` (a TransformerConfig) uses at `pp_size` stages: the
    run's (`config.pipeline_split`), else the even one; a ValueError naming the flags when it
    cannot hold `vp_stage` or does not fit."""
    split = config.pipeline_split
    if pp_size == 1 or split is None:
        split = PipelineSplit(config.num_layers, pp_size)
    if split.pp_size != pp_size:
        raise ValueError(f"the pipeline split is for {split.pp_size} stages, the run has {pp_size}")
    problems = split.problems()
    if problems:
        raise ValueError(problems[0])
    if not 0 <= (vp_stage or 0) < split.virtual_size:
        raise ValueError(f"model chunk vp_stage={vp_stage} asked for, but this run has {split.virtual_size} "
                         f"per rank (--num-virtual-stages-per-pipeline-rank)")
    return split


def check_interleaved_batch(args, check):
    """The interleaved schedule's conditions on the micro-batches of a step (a ramped-up batch size
    is checked at each size, by the schedule)."""
    split = getattr(args, "pipeline_split", None)
    if split is None or not split.interleaved or getattr(args, "rampup_batch_size", None):
        return
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size and per_step and args.global_batch_size % per_step == 0:
        message = check_interleaved_micro_batches(split.pp_size, split.microbatch_group_size,
                                                  args.global_batch_size // per_step)
        check.require(message is None, message)


def run_stage_layers(args):
    """The run's stage_layers (None without pipeline stages or a layer count)."""
    split = getattr(args, "pipeline_split", None)
    return split.stage_layers() if split is not None and split.pp_size > 1 else None


def same_stage_layers(saved, current, num_layers, pp_size):
    """Whether two stage_layers records (None: the even split of `num_layers` at `pp_size`, as a
    checkpoint saved before splits were recorded has) place every layer alike."""
    even = PipelineSplit(num_layers, pp_size).stage_layers() if num_layers and num_layers % pp_size == 0 else None
    return (saved or even) == (current or even)
