"""A Finetuner whose model is a plain MindSpore MLP, without any RapidGPT layer: data parallelism
asks nothing of the model. tests/test_parallel.py runs it on 1 and 2 processes (DP=2) and compares
the logs; with --tensor-model-parallel-size 2 it must be refused (the MLP has no TP layers).

--no-gather-metrics: run_compute_metrics leaves out self.gather, so on DP=2 each rank computes
its metrics over its own half of the validation set; the engine must notice, warn once and
report the ranks' sample-weighted mean (the accuracy of the whole set).

Data: 4 Gaussian blobs in 16 dimensions, the label is the blob.
"""
import numpy as np
from mindspore import nn, ops

from rapidgpt import Finetuner, RapidGPTEngine
from rapidgpt.training.metrics import evaluate_classification


class Blobs:
    def __init__(self, size, seed):
        centers = np.random.default_rng(0).normal(size=(4, 16))
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 4, size).astype(np.int32)
        self.points = (centers[self.labels] + rng.normal(size=(size, 16))).astype(np.float32)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"x": self.points[i], "label": self.labels[i]}


class MLPFinetuner(Finetuner):
    def train_valid_test_datasets_provider(self):
        return Blobs(128, 1), Blobs(40, 2), None, None

    def model_optimizer_lr_scheduler_provider(self):
        return nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)), None, None

    def run_forward_step(self, batch, model):
        return ops.cross_entropy(model(batch["x"]), batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        gather = np.asarray if self.args.no_gather_metrics else self.gather
        return evaluate_classification(lambda batch: model(batch["x"]), eval_dataloader, gather)


def add_flags(parser):
    parser.add_argument("--no-gather-metrics", action="store_true",
                        help="compute the metrics over this rank's share of the validation set only")
    return parser


if __name__ == "__main__":
    MLPFinetuner(engine=RapidGPTEngine(extra_args_provider=add_flags)).train()
