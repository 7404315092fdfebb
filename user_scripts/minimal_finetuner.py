# user_scripts/minimal_finetuner.py: a complete Finetuner with its own data and model
import numpy as np

from rapidgpt import Finetuner, RapidGPTEngine
from mindspore import nn, ops          # after rapidgpt, which sets OpenMP's environment first


class LargestCoordinate:
    """ds[i] = {"x": float32 [8], "label": int32 []}: random vectors, labelled by their largest coordinate."""
    def __init__(self, size, seed):
        self.x = np.random.default_rng(seed).normal(size=(size, 8)).astype(np.float32)
        self.label = self.x.argmax(axis=1).astype(np.int32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "label": self.label[i]}


class MyFinetuner(Finetuner):
    def train_valid_test_datasets_provider(self):
        return LargestCoordinate(1024, 1), LargestCoordinate(256, 2), None, None   # None: stack each field
    def model_optimizer_lr_scheduler_provider(self):
        model = nn.SequentialCell(nn.Dense(8, 64), nn.ReLU(), nn.Dense(64, 8))
        return model, None, None                        # None: optimizer/schedule from the flags
    def run_forward_step(self, batch, model):           # batch: dict of Tensors [micro batch, ...]
        return ops.cross_entropy(model(batch["x"]), batch["label"])
    def run_compute_metrics(self, model, eval_dataloader):
        predictions, labels = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]   # a rank may get none
        for batch in eval_dataloader:                   # this data-parallel rank's share of the set
            predictions.append(model(batch["x"]).argmax(axis=-1).asnumpy())
            labels.append(batch["label"].asnumpy())
        predictions = self.gather(np.concatenate(predictions))   # every DP rank's, concatenated
        labels = self.gather(np.concatenate(labels))            # (every rank must call gather)
        return {"accuracy": float((predictions == labels).mean())}


if __name__ == "__main__":
    MyFinetuner(engine=RapidGPTEngine()).train()
