"""Finetuner: epochs over a labelled dataset, metrics each epoch (Rapidformer's Finetuner).

    class MyFinetuner(Finetuner):
        def train_valid_test_datasets_provider(self):
            return train_ds, valid_ds, test_ds, collate_fn    # collate_fn None: stack fields
        def model_optimizer_lr_scheduler_provider(self):
            return model, None, None
        def run_forward_step(self, batch, model):             # batch: dict/tuple of tensors
            return loss
        def run_compute_metrics(self, model, eval_dataloader):
            ...                                               # loop over batches, return {"accuracy": ...}

`run_forward_step` is compiled into the training step (mindspore.jit); `run_compute_metrics` runs
eagerly with the model in eval mode, over batches of tensors. Training runs `--epochs` passes
(or `--train-iters` iterations) in global batches of `--global-batch-size`, shuffled per epoch.
"""
from rapidgpt.data.samplers import EpochSampler, SequentialSampler, micro_batches
from rapidgpt.training.reporting import report_metrics
from rapidgpt.training.trainer import Trainer, hook, to_tensors


class EvalDataLoader:
    """Re-iterable batches of tensors over an evaluation dataset (each sample once, in order)."""

    def __init__(self, dataset, micro_batch_size, collate_fn):
        self.dataset, self.micro_batch_size, self.collate_fn = dataset, micro_batch_size, collate_fn

    def __iter__(self):
        sampler = SequentialSampler(len(self.dataset), self.micro_batch_size)
        return map(to_tensors, micro_batches(self.dataset, sampler, self.collate_fn))

    def __len__(self):
        return -(-len(self.dataset) // self.micro_batch_size)


class Finetuner(Trainer):

    @hook("(self) -> (train, valid, test, collate_fn)")
    def train_valid_test_datasets_provider(self):
        raise NotImplementedError

    @hook("(self) -> (model, optimizer|None, lr_scheduler|None)")
    def model_optimizer_lr_scheduler_provider(self):
        raise NotImplementedError

    @hook("(self, batch, model) -> scalar loss")
    def run_forward_step(self, batch, model):
        raise NotImplementedError

    @hook("(self, model, eval_dataloader) -> dict of floats (use self.gather across ranks)")
    def run_compute_metrics(self, model, eval_dataloader):
        raise NotImplementedError

    def train(self):
        self.check_hooks()
        args = self.args
        train_ds, valid_ds, _test_ds, collate_fn = self.train_valid_test_datasets_provider()
        iters_per_epoch = len(train_ds) // args.global_batch_size
        if iters_per_epoch == 0:
            raise ValueError(f"the training set has {len(train_ds)} samples, fewer than "
                             f"--global-batch-size {args.global_batch_size}")
        if not (args.epochs or args.train_iters):
            raise ValueError("finetuning needs --epochs (or --train-iters)")
        # --epochs becomes iterations here, before the default LR schedule (which decays over
        # --train-iters) is built.
        args.train_iters = train_iters = args.train_iters or args.epochs * iters_per_epoch
        model, optimizer, scheduler = self.build_model_optimizer_scheduler()
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, scheduler
        iteration, consumed = self.load_checkpoint_if_asked()
        sampler = EpochSampler(len(train_ds), consumed, args.micro_batch_size, seed=args.seed)
        batches = micro_batches(train_ds, sampler, collate_fn, args.num_workers)
        eval_loader = EvalDataLoader(valid_ds, args.micro_batch_size, collate_fn) if valid_ds is not None else None
        self.history = []

        def forward(batch):
            return self.run_forward_step(batch, model)

        def evaluate(iteration):
            metrics = {k: float(v) for k, v in self.run_compute_metrics(model, eval_loader).items()}
            epoch = iteration / iters_per_epoch
            report_metrics(f"validation at epoch {epoch:g} (iteration {iteration})", iteration, metrics)
            self.history.append((iteration, metrics))

        finished = True
        if not args.skip_train and iteration < train_iters:
            finished = self.train_loop(model, optimizer, scheduler, forward, batches, train_iters,
                                       evaluate if eval_loader is not None else None, iters_per_epoch,
                                       start_iteration=iteration, consumed=consumed)
        if finished and eval_loader is not None and (args.skip_train or train_iters % iters_per_epoch):
            self._evaluate_in_eval_mode(model, evaluate, train_iters)
        return model
