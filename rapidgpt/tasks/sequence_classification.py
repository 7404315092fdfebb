"""`rapidgpt --task sequence_classification`: finetune the built-in GPT or BERT to label texts.

    rapidgpt --task sequence_classification --pretrained-checkpoint pretrained/ \
        --data-path train.jsonl --valid-data-path valid.jsonl --epochs 3 \
        --micro-batch-size 16 --lr 2e-5 --lr-warmup-fraction 0.1 --save finetuned/

    # evaluate the kept best epoch; one prediction per validation example into predictions.jsonl
    rapidgpt --task sequence_classification --load finetuned/best --skip-train \
        --valid-data-path valid.jsonl --predictions-file predictions.jsonl

Data: .jsonl or .tsv files of `text` (or `text_a` + `text_b`) and `label`, encoded as
rapidgpt/data/classification.py describes (a GPT reads a pair as `text_a EOD text_b EOD`, BERT as
`[CLS] text_a [SEP] text_b [SEP]`). Model: the one the checkpoint describes (its metadata, or a
Hugging Face folder's config.json, supplies the architecture and tokenizer flags): a GPT plus a
linear head on the last real token (rapidgpt/models/classification.py), or a BERT plus a linear
head on its pooled [CLS] as BertForSequenceClassification (rapidgpt/models/bert.py), e.g.

    rapidgpt --task sequence_classification --pretrained-model-name-or-path ./bert-base-cased \
        --data-path train.tsv --valid-data-path dev.tsv --epochs 3 --micro-batch-size 32 --lr 2e-5
 The loss (logged
as `loss`, with samples per second) is the cross-entropy of the labels. After every
epoch the validation set's accuracy and macro-F1 are logged and, with --save, the best epoch by
--best-metric (accuracy by default) is kept under `<save>/best/`.

--skip-train --load DIR evaluates a checkpoint: it needs no training data and no --epochs (the
label map comes from the checkpoint). --predictions-file FILE writes, after each validation (the
last one stays: with --skip-train the loaded checkpoint's), one JSON line per validation
example in file order, `{"index", "prediction", "label", "probabilities"}`
(rapidgpt.data.classification.write_predictions); rank 0 writes it, from every data-parallel
rank's predictions.
"""
from mindspore import ops

from rapidgpt.arguments import parse_args
from rapidgpt.data.classification import ClassificationDataError, classification_datasets, write_predictions
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.global_vars import get_tokenizer
from rapidgpt.models.builtin import build_classifier
from rapidgpt.parallel.state import get_parallel_state
from rapidgpt.tasks.pretraining import vocab_size
from rapidgpt.training.finetuner import Finetuner
from rapidgpt.training.metrics import classification_metrics, predict_classes


def logits(model, batch):
    """`[b, classes]` logits of a batch of encoded texts (BERT's batches hold token types)."""
    if "types" in batch:
        return model(batch["tokens"], batch["padding_mask"], batch["types"])
    return model(batch["tokens"], batch["position_ids"], batch["last_index"])


class SequenceClassificationFinetuner(Finetuner):

    def train_valid_test_datasets_provider(self):
        train, valid, test = classification_datasets(self.args, get_tokenizer(), self.logger)
        return train, valid, test, None

    def model_optimizer_lr_scheduler_provider(self):
        return build_classifier(self.args, vocab_size(self.args)), None, None

    def run_forward_step(self, batch, model):
        return ops.cross_entropy(logits(model, batch), batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        predictions = predict_classes(lambda batch: logits(model, batch), eval_dataloader, self.gather)
        path = self.args.predictions_file
        if path and eval_dataloader.split == "validation" and get_parallel_state().rank == 0:
            write_predictions(path, predictions, self.args.labels)
            self.logger.info(f" predictions for the {len(predictions.labels)} validation examples written to {path}")
        return classification_metrics(predictions.classes, predictions.labels)


def main(argv=None, args=None):
    """Run the task on `argv` (default: the command line), or on the already parsed `args`."""
    args = args if args is not None else parse_args(argv=argv)
    engine = RapidGPTEngine(args=args)
    if get_tokenizer() is None:
        raise ClassificationDataError("sequence classification reads text: give --pretrained-checkpoint "
                                      "(or --load) of a checkpoint that records its tokenizer, or "
                                      "--tokenizer-type/--vocab-file/--merge-file")
    trainer = SequenceClassificationFinetuner(engine)
    trainer.train()
    if trainer.best is not None:
        best = trainer.best
        trainer.logger.info(f" best validation {best['metric']}: {best['value']:.6f} at epoch {best['epoch']:g} "
                            f"(iteration {best['iteration']}), kept under {args.save}/best")
    return 0
