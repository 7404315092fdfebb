"""Sentence-pair classification with BERT (as Rapidformer's MRPC example): a RapidGPT Finetuner.

    # a local Hugging Face BERT folder (config.json + model.safetensors + vocab.txt) and .tsv files
    # with text_a, text_b, label columns (MRPC's train.tsv/dev.tsv, renamed columns):
    rapidgpt --user-script user_scripts/finetune_bert.py \
        --pretrained-model-name-or-path ./bert-base-cased \
        --data-path train.tsv --valid-data-path dev.tsv --seq-length 128 \
        --micro-batch-size 32 --epochs 3 --lr 2e-5 --lr-warmup-fraction 0.1 --save runs/mrpc

    # without data: next-sentence pairs made from the embedded demo documents
    # (launch/finetune_bert.sh: a BERT pretrained by launch/pretrain_bert.sh, or a fresh one)

Rapidformer's four hooks:
  - `train_valid_test_datasets_provider()` -> (train, valid, test, collate function): examples
    encoded as `[CLS] text_a [SEP] text_b [SEP]` with token types and a padding mask
    (rapidgpt.data.classification.BertClassificationDataset, as Hugging Face's tokenizer does);
  - `model_optimizer_lr_scheduler_provider()` -> the built-in BertSequenceClassifier (the encoder
    and pooler of BertModel + a linear head on the pooled [CLS], as BertForSequenceClassification);
    with --pretrained-model-name-or-path / --pretrained-checkpoint the engine loads the encoder and
    says which tensors stay freshly initialised (the head);
  - `run_forward_step(batch, model)` -> the cross-entropy (compiled into the training step);
  - `run_compute_metrics(model, eval_dataloader)` -> {"accuracy", "f1"} after every epoch.
"""
import sys

import numpy as np

from rapidgpt import Finetuner, RapidGPTEngine, get_args, get_tokenizer
from rapidgpt.data.classification import BertClassificationDataset, Example, classification_datasets
from rapidgpt.data.demo_corpus import demo_bert_corpus
from rapidgpt.models.bert import build_bert_classifier
from rapidgpt.training.metrics import evaluate_classification

# MindSpore after rapidgpt: importing rapidgpt sets OMP_WAIT_POLICY before MindSpore loads OpenMP
# (rapidgpt/config/kernel_fusion.py)
from mindspore import ops

LABELS = ["next", "random"]


def add_pair_args(parser):
    group = parser.add_argument_group("BERT pair example (made-up data, without --data-path)")
    group.add_argument("--train-size", type=int, default=1024, help="training pairs")
    group.add_argument("--valid-size", type=int, default=256, help="validation pairs")
    return parser


def next_sentence_examples(n, seed, first_document):
    """`n` sentence pairs from the demo documents (every other one, starting at `first_document`,
    so train and validation use different documents): "next" when B follows A in its document,
    "random" when B is a sentence of another document."""
    import json
    from nltk.tokenize.punkt import PunktSentenceTokenizer
    with open(demo_bert_corpus()["jsonl"], encoding="utf-8") as f:
        documents = [json.loads(line)["text"] for line in f][first_document::2]
    splitter = PunktSentenceTokenizer()
    sentences = [[s for s in splitter.tokenize(text) if len(s) > 20] for text in documents]
    sentences = [d for d in sentences if len(d) > 1]
    rng, examples = np.random.RandomState(seed), []
    for i in range(n):
        d = rng.randint(len(sentences))
        j = rng.randint(len(sentences[d]) - 1)
        if rng.rand() < 0.5:
            b, label = sentences[d][j + 1], "next"
        else:
            other = sentences[(d + 1 + rng.randint(len(sentences) - 1)) % len(sentences)]
            b, label = other[rng.randint(len(other))], "random"
        examples.append(Example(sentences[d][j], b, label, f"pair {i}"))
    return examples


def reads_files(args):
    return bool(args.data_path or args.train_data_path or args.valid_data_path)


class BertPairFinetuner(Finetuner):

    def train_valid_test_datasets_provider(self):
        args, tokenizer = self.args, get_tokenizer()
        if reads_files(args):
            return (*classification_datasets(args, tokenizer, self.logger), None)
        args.labels = LABELS
        train = BertClassificationDataset(next_sentence_examples(args.train_size, args.seed, 0), LABELS,
                                          tokenizer, args.seq_length)
        valid = BertClassificationDataset(next_sentence_examples(args.valid_size, args.seed + 1, 1), LABELS,
                                          tokenizer, args.seq_length)
        return train, valid, None, None

    def model_optimizer_lr_scheduler_provider(self):
        return build_bert_classifier(self.args, get_tokenizer().vocab_size), None, None

    def run_forward_step(self, batch, model):
        logits = model(batch["tokens"], batch["padding_mask"], batch["types"])     # [b, classes]
        return ops.cross_entropy(logits, batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        return evaluate_classification(
            lambda batch: model(batch["tokens"], batch["padding_mask"], batch["types"]),
            eval_dataloader, self.gather)


if __name__ == "__main__":
    engine = RapidGPTEngine(extra_args_provider=add_pair_args)
    args = get_args()
    if get_tokenizer() is None or args.model_type != "bert":
        print("finetune_bert.py: error: give a BERT: --pretrained-model-name-or-path HF_BERT_DIR (or "
              "--pretrained-checkpoint of a RapidGPT BERT), or --tokenizer-type BertWordPieceLowerCase "
              "--vocab-file vocab.txt for a fresh one", file=sys.stderr)
        sys.exit(2)
    if not reads_files(args):
        args.num_classes = len(LABELS)
    trainer = BertPairFinetuner(engine=engine)
    trainer.train()
    if trainer.history:
        iteration, metrics = trainer.history[-1]
        trainer.logger.info(f"final validation accuracy {metrics['accuracy']:.3f} after {iteration} iterations")
