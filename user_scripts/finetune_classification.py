"""Sentence classification with a GPT backbone: a RapidGPT Finetuner on a dataset of your own.

    rapidgpt --user-script user_scripts/finetune_classification.py \
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \
        --num-classes 3 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
        --micro-batch-size 16 --epochs 3 --lr 2e-3

(launch/finetune_classification.sh runs it with the embedded demo corpus's tokenizer).

What it shows:
  - a dataset made in the script (any map-style dataset works: `len()` and `ds[i]` -> dict of arrays);
  - a model of your own: the built-in GPT as a backbone plus a classification head;
  - `run_forward_step(batch, model)` -> the loss (compiled into the training step);
  - `run_compute_metrics(model, eval_dataloader)` -> {"accuracy": ...}, run after every epoch;
  - a flag of your own (`--num-classes`) added with `extra_args_provider`.

The data: short "sentences" about one of a few topics (sports, food, weather, ...). Each mixes
several words of its topic, one distracting word of another topic and filler words, in random
order; the label is the topic. A model must look at the words, not at their positions.
"""
import sys

import numpy as np
from mindspore import nn, ops

from rapidgpt import Finetuner, RapidGPTEngine, get_args, get_tokenizer
from rapidgpt.models import build_gpt_model


# ----------------------------------------------------------------------------------------------
# A flag of our own
# ----------------------------------------------------------------------------------------------

def add_classification_args(parser):
    """Extra flags for this script; they are parsed and validated with the engine's own."""
    group = parser.add_argument_group("classification example")
    group.add_argument("--num-classes", type=int, default=3, choices=range(2, len(TOPICS) + 1),
                       help="how many topics to tell apart")
    group.add_argument("--train-size", type=int, default=768, help="training sentences")
    group.add_argument("--valid-size", type=int, default=192, help="validation sentences")
    return parser


# ----------------------------------------------------------------------------------------------
# The dataset: a small synthetic topic-classification corpus, made deterministically from --seed
# ----------------------------------------------------------------------------------------------

TOPICS = {
    "food": "pizza bread soup cheese recipe kitchen dinner sauce oven salad".split(),
    "music": "guitar song concert piano drums melody band album singer chorus".split(),
    "sports": "football goal team coach match score player stadium league referee".split(),
    "travel": "train airport hotel ticket beach passport luggage flight map tour".split(),
    "weather": "rain storm cloud sunny wind snow forecast thunder fog heat".split(),
}
FILLER = ("the a we talked about yesterday and then really was very some new old with my friend "
          "today it is of after").split()


def make_sentence(rng, topic_names, label):
    """3-5 words of topic `label`, one word of another topic, 3-6 filler words, shuffled."""
    words = list(rng.choice(TOPICS[topic_names[label]], size=rng.integers(3, 6)))
    other = (label + rng.integers(1, len(topic_names))) % len(topic_names)
    words.append(rng.choice(TOPICS[topic_names[other]]))
    words += list(rng.choice(FILLER, size=rng.integers(3, 7)))
    rng.shuffle(words)
    return " ".join(words)


class TopicDataset:
    """`ds[i]` -> {"tokens", "position_ids", "padding_mask" [seq_length], "label" []} numpy arrays.

    Sentences are tokenized with the run's tokenizer and right-padded to --seq-length; the
    padding mask (1 on real tokens) lets the model average over the sentence only.
    """

    def __init__(self, size, num_classes, seq_length, tokenizer, seed):
        rng = np.random.default_rng(seed)
        topic_names = sorted(TOPICS)[:num_classes]
        self.samples = []
        for _ in range(size):
            label = int(rng.integers(num_classes))
            ids = tokenizer.tokenize(make_sentence(rng, topic_names, label))[:seq_length]
            tokens = np.full(seq_length, tokenizer.eod, np.int32)     # pad with the end-of-text id
            tokens[:len(ids)] = ids
            mask = np.zeros(seq_length, np.float32)
            mask[:len(ids)] = 1.0
            self.samples.append({"tokens": tokens,
                                 "position_ids": np.arange(seq_length, dtype=np.int32),
                                 "padding_mask": mask,
                                 "label": np.int32(label)})

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


# ----------------------------------------------------------------------------------------------
# The model: GPT backbone + classification head
# ----------------------------------------------------------------------------------------------

class GPTClassifier(nn.Cell):
    """Mean of the GPT's final hidden states over the real tokens, then a linear layer to classes.

    The head is a plain `nn.Dense`: its weights are small and replicated, so it needs nothing from
    tensor parallelism (a `rapidgpt.parallel.ColumnParallelLinear` would split it across ranks).
    """

    def __init__(self, backbone, hidden_size, num_classes):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Dense(hidden_size, num_classes)

    def construct(self, tokens, position_ids, padding_mask):
        hidden = self.backbone.hidden_states(tokens, position_ids)        # [b, s, h], causal attention
        mask = padding_mask.expand_dims(-1)                                # [b, s, 1]
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)            # [b, h]
        return self.head(pooled)                                           # [b, num_classes]


# ----------------------------------------------------------------------------------------------
# The Finetuner
# ----------------------------------------------------------------------------------------------

class TopicClassificationFinetuner(Finetuner):

    def train_valid_test_datasets_provider(self):
        """Train and validation sets (different seeds, so different sentences); no test set.

        The fourth value is the collate function: None stacks each field of the samples into a
        batch, which is all this dataset needs.
        """
        args, tokenizer = self.args, get_tokenizer()
        train = TopicDataset(args.train_size, args.num_classes, args.seq_length, tokenizer, args.seed)
        valid = TopicDataset(args.valid_size, args.num_classes, args.seq_length, tokenizer, args.seed + 1)
        return train, valid, None, None

    def model_optimizer_lr_scheduler_provider(self):
        """GPT from the model flags (--num-layers, --hidden-size, ...) with a head of --num-classes.

        None, None: AdamW and the learning-rate schedule are built from the flags.
        """
        args = self.args
        backbone = build_gpt_model(args, get_tokenizer().vocab_size)
        return GPTClassifier(backbone, args.hidden_size, args.num_classes), None, None

    def run_forward_step(self, batch, model):
        """Cross-entropy of one micro-batch. Compiled with mindspore.jit: tensor code only."""
        logits = model(batch["tokens"], batch["position_ids"], batch["padding_mask"])
        return ops.cross_entropy(logits, batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        """Accuracy over the validation set (runs eagerly, with dropout off).

        `eval_dataloader` yields batches of Tensors, each sample once. `self.gather` collects
        the per-sample results of every data-parallel rank, so the metric covers the whole set.
        """
        correct = []
        for batch in eval_dataloader:
            logits = model(batch["tokens"], batch["position_ids"], batch["padding_mask"])
            predictions = logits.argmax(axis=-1).asnumpy()
            correct.append(predictions == batch["label"].asnumpy())
        correct = self.gather(np.concatenate(correct))
        return {"accuracy": float(correct.mean())}


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def check_tokenizer():
    """The sentences are text: refuse to start without a tokenizer, saying what to pass."""
    if get_tokenizer() is None:
        print("finetune_classification.py: error: the sentences need a tokenizer: pass --tokenizer-type "
              "GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt "
              "(launch/finetune_classification.sh uses the demo corpus's)", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    engine = RapidGPTEngine(extra_args_provider=add_classification_args)
    args = get_args()
    check_tokenizer()
    trainer = TopicClassificationFinetuner(engine=engine)
    trainer.train()
    # trainer.history holds (iteration, metrics) of every evaluation.
    iteration, metrics = trainer.history[-1]
    chance = 1.0 / args.num_classes
    trainer.logger.info(f"final validation accuracy {metrics['accuracy']:.3f} (chance {chance:.3f}) "
                        f"after {iteration} iterations")
