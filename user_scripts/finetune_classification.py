"""Sentence classification with a GPT backbone: a RapidGPT Finetuner with a model of your own.

    rapidgpt --user-script user_scripts/finetune_classification.py \
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \
        --num-classes 3 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
        --micro-batch-size 16 --epochs 3 --lr 2e-3

    # your own labelled files and a pretrained GPT (its checkpoint supplies the model flags):
    rapidgpt --user-script user_scripts/finetune_classification.py --pretrained-checkpoint ckpt/ \
        --data-path train.jsonl --valid-data-path valid.jsonl --micro-batch-size 16 --epochs 3 --save runs/topics

    # evaluate the best epoch kept by --save (its checkpoint supplies the model flags and labels):
    rapidgpt --user-script user_scripts/finetune_classification.py --load runs/topics/best --skip-train \
        --valid-data-path valid.jsonl

(launch/finetune_classification.sh runs it with the embedded demo corpus's tokenizer).
`rapidgpt --task sequence_classification` is the same job as a black box, with the built-in
last-token head; this file is the white-box version to copy and change.

What it shows:
  - data: .jsonl/.tsv files read by `rapidgpt.data.classification` (as the task does), or else a
    dataset made in the script (any map-style dataset works: `len()` and `ds[i]` -> dict of arrays);
  - a model of your own: the built-in GPT as a backbone plus a classification head; with
    --pretrained-checkpoint the backbone starts from pretrained weights, the head afresh;
  - `run_forward_step(batch, model)` -> the loss (compiled into the training step);
  - `run_compute_metrics(model, eval_dataloader)` -> {"accuracy": ..., "f1": ...}, after every epoch;
  - flags of your own (`--train-size`, `--valid-size`) added with `extra_args_provider`.

The made-up data: short "sentences" about one of a few topics (sports, food, weather, ...). Each
mixes several words of its topic, one distracting word of another topic and filler words, in
random order; the label is the topic. A model must look at the words, not at their positions.
"""
import sys

import numpy as np

from rapidgpt import Finetuner, RapidGPTEngine, get_args, get_tokenizer
from rapidgpt.data.classification import ClassificationDataset, Example, classification_datasets
from rapidgpt.models import build_gpt_model
from rapidgpt.training.metrics import evaluate_classification

# MindSpore after rapidgpt: importing rapidgpt sets OMP_WAIT_POLICY before MindSpore loads OpenMP
# (rapidgpt/config/kernel_fusion.py)
from mindspore import nn, ops


# ----------------------------------------------------------------------------------------------
# Flags of our own
# ----------------------------------------------------------------------------------------------

def add_classification_args(parser):
    """Extra flags for this script; they are parsed and validated with the engine's own.
    (--num-classes is the engine's: with the made-up data, how many topics to tell apart.)"""
    group = parser.add_argument_group("classification example (made-up data, without --data-path)")
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


def topic_examples(size, topic_names, seed):
    """`size` labelled sentences, as the examples read from a data file are."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(size):
        label = int(rng.integers(len(topic_names)))
        examples.append(Example(make_sentence(rng, topic_names, label), None, topic_names[label],
                                f"made-up sentence {i}"))
    return examples


# ----------------------------------------------------------------------------------------------
# The model: GPT backbone + classification head
# ----------------------------------------------------------------------------------------------

class GPTClassifier(nn.Cell):
    """Mean of the GPT's final hidden states over the real tokens, then a linear layer to classes.

    (The built-in `rapidgpt.models.classification.GPTSequenceClassifier` reads the last token
    instead.) The head is a plain `nn.Dense`: its weights are small and replicated, so it needs
    nothing from tensor parallelism (a `rapidgpt.parallel.ColumnParallelLinear` would split it
    across ranks). With --pretrained-checkpoint, the checkpoint's GPT tensors load into
    `backbone.*`, and `head.*` keeps its fresh initialisation.
    """

    def __init__(self, backbone, hidden_size, num_classes):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Dense(hidden_size, num_classes)

    def construct(self, tokens, position_ids, last_index):
        hidden = self.backbone.hidden_states(tokens, position_ids)        # [b, s, h], causal attention
        positions = ops.arange(tokens.shape[1], dtype=last_index.dtype).reshape(1, -1)   # [1, s]
        mask = (positions <= last_index.reshape(-1, 1)).astype(hidden.dtype).expand_dims(-1)  # [b, s, 1]
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)            # [b, h]
        return self.head(pooled)                                           # [b, num_classes]


# ----------------------------------------------------------------------------------------------
# The Finetuner
# ----------------------------------------------------------------------------------------------

def reads_files(args):
    """Whether the data comes from files: training data, or only validation data to evaluate a
    saved model with (--skip-train --load DIR, whose checkpoint records the label map)."""
    return bool(args.data_path or args.train_data_path or args.valid_data_path)


class TopicClassificationFinetuner(Finetuner):

    def train_valid_test_datasets_provider(self):
        """Train, validation (and test) sets: the files of --data-path, --valid-data-path,
        --test-data-path (no training set when only evaluating), else made-up sentences (train
        and validation from different seeds).

        Samples are {"tokens", "position_ids" [seq_length], "last_index", "label" []} numpy
        arrays: the sentence's tokens and an end-of-text token, right-padded to --seq-length.
        The fourth value is the collate function: None stacks each field of the samples into a
        batch, which is all these datasets need.
        """
        args, tokenizer = self.args, get_tokenizer()
        if reads_files(args):
            return (*classification_datasets(args, tokenizer, self.logger), None)
        args.labels = sorted(TOPICS)[:args.num_classes]        # class id -> name, kept in checkpoints
        train = ClassificationDataset(topic_examples(args.train_size, args.labels, args.seed), args.labels,
                                      tokenizer, args.seq_length)
        valid = ClassificationDataset(topic_examples(args.valid_size, args.labels, args.seed + 1),
                                      args.labels, tokenizer, args.seq_length)
        return train, valid, None, None

    def model_optimizer_lr_scheduler_provider(self):
        """GPT from the model flags (--num-layers, --hidden-size, ...; with --pretrained-checkpoint,
        from its metadata) with a head of --num-classes.

        None, None: AdamW and the learning-rate schedule are built from the flags.
        """
        args = self.args
        backbone = build_gpt_model(args, get_tokenizer().vocab_size)
        return GPTClassifier(backbone, args.hidden_size, args.num_classes), None, None

    def run_forward_step(self, batch, model):
        """Cross-entropy of one micro-batch. Compiled with mindspore.jit: tensor code only."""
        logits = model(batch["tokens"], batch["position_ids"], batch["last_index"])
        return ops.cross_entropy(logits, batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        """Accuracy and macro-F1 over the validation set (runs eagerly, with dropout off).

        `eval_dataloader` yields batches of Tensors, each sample once; `evaluate_classification`
        takes the argmax of each batch's logits, collects predictions and labels of every
        data-parallel rank with `self.gather` (so the metrics cover the whole set) and returns
        {"accuracy": ..., "f1": ...}.
        """
        return evaluate_classification(
            lambda batch: model(batch["tokens"], batch["position_ids"], batch["last_index"]),
            eval_dataloader, self.gather)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def check_flags(args):
    """Refuse to start without a tokenizer, or with more topics than the made-up data has."""
    problem = None
    if get_tokenizer() is None:
        problem = ("the sentences need a tokenizer: pass --tokenizer-type GPT2BPETokenizer --vocab-file "
                   "vocab.json --merge-file merges.txt, or a --pretrained-checkpoint that records one "
                   "(launch/finetune_classification.sh uses the demo corpus's)")
    elif not reads_files(args):
        args.num_classes = args.num_classes or 3
        if args.num_classes > len(TOPICS):
            problem = f"--num-classes {args.num_classes}: the made-up data has {len(TOPICS)} topics"
    if problem:
        print(f"finetune_classification.py: error: {problem}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    engine = RapidGPTEngine(extra_args_provider=add_classification_args)
    args = get_args()
    check_flags(args)
    trainer = TopicClassificationFinetuner(engine=engine)
    trainer.train()
    if trainer.history:                  # (iteration, metrics) of every validation
        iteration, metrics = trainer.history[-1]
        chance = 1.0 / args.num_classes
        trainer.logger.info(f"final validation accuracy {metrics['accuracy']:.3f} (chance {chance:.3f}) "
                            f"after {iteration} iterations")
