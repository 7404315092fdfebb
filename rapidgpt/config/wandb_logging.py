"""Weights & Biases logging, Megatron's flags: --wandb-project, --wandb-exp-name, --wandb-save-dir,
--wandb-entity.

With --wandb-project, rank 0 opens one W&B run (`wandb.init(project=, name=, dir=, entity=,
config=<every flag>)`, as Megatron's `_set_wandb_writer` does) and logs every scalar that
--tensorboard-dir gets, under the same names and at the same iterations: Megatron logs the same
scalars to both. Rank 0, not Megatron's last rank: RapidGPT gathers the numbers it logs (losses,
norms, timers) on rank 0, where its TensorBoard writer is too. The run's files go to
--wandb-save-dir, else `<--save>/wandb` (Megatron's default), else W&B's own default (./wandb).

The `wandb` library is an optional extra (`pip install wandb`); asked for without it, the run
stops at the flag check with one line. W&B needs its server unless it runs offline: on a machine
without internet access set WANDB_MODE=offline (and `wandb sync` the folder later), as with
Megatron.
"""
import importlib.util
import os

FLAGS = ("wandb_exp_name", "wandb_save_dir", "wandb_entity")


def add_wandb_args(parser):
    g = parser.add_argument_group("Weights & Biases", "Megatron's W&B logging (the wandb package)")
    g.add_argument("--wandb-project", default=None,
                   help="log every TensorBoard scalar to this W&B project too (rank 0; needs `pip install wandb`)")
    g.add_argument("--wandb-exp-name", default=None, help="the W&B run's name (default: W&B's)")
    g.add_argument("--wandb-save-dir", default=None,
                   help="where the W&B run's files go (default: <--save>/wandb, else ./wandb)")
    g.add_argument("--wandb-entity", default=None, help="the W&B team or user the project belongs to")


def check_wandb_args(args, check):
    if not args.wandb_project:
        for name in FLAGS:
            check.require(getattr(args, name) is None,
                          f"--{name.replace('_', '-')}: sets up W&B logging; give --wandb-project too, or remove it")
        return
    check.require(importlib.util.find_spec("wandb") is not None,
                  "--wandb-project: W&B logging needs the wandb package: pip install wandb (or remove the flag)")


class WandbScalars:
    """A W&B run behind TensorBoard's `add_scalar(tag, value, step)`."""

    def __init__(self, run):
        self.run = run

    def add_scalar(self, tag, value, step):
        self.run.log({tag: value}, step=step)

    def close(self):
        """Nothing: scalars still come after the training loop closes its writers (the final
        validation); the run is finished when the next run of the process opens one, or at exit
        (W&B's own exit hook)."""

    def finish(self):
        self.run.finish()


def open_wandb_run(args):
    """The W&B run of --wandb-project (its caller asks only with one), opened as Megatron opens it."""
    import wandb
    directory = args.wandb_save_dir or (os.path.join(args.save, "wandb") if args.save else None)
    options = {"project": args.wandb_project, "name": args.wandb_exp_name,
               "config": {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, type(None)))}}
    if directory:
        os.makedirs(directory, exist_ok=True)
        options["dir"] = directory
    if args.wandb_entity:
        options["entity"] = args.wandb_entity
    return WandbScalars(wandb.init(**options))
