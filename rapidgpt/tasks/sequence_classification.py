"""`rapidgpt --task sequence_classification`: finetune the built-in GPT to label texts.

    rapidgpt --task sequence_classification --pretrained-checkpoint pretrained/ \
        --data-path train.jsonl --valid-data-path valid.jsonl --epochs 3 \
        --micro-batch-size 16 --lr 2e-5 --lr-warmup-fraction 0.1 --save finetuned/

Data: .jsonl or .tsv files of `text` (or `text_a` + `text_b`) and `label`, encoded as
rapidgpt/data/classification.py describes (a pair is joined as `text_a EOD text_b EOD`). Model:
the GPT described by the checkpoint (its metadata supplies the architecture and tokenizer flags)
plus a linear head on the last real token, rapidgpt/models/classification.py. The loss (logged
as `lm loss`, as Megatron's finetuning does) is the cross-entropy of the labels. After every
epoch the validation set's accuracy and macro-F1 are logged and, with --save, the best epoch by
--best-metric (accuracy by default) is kept under `<save>/best/`.
"""
from mindspore import ops

from rapidgpt.arguments import parse_args
from rapidgpt.data.classification import ClassificationDataError, classification_datasets
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.global_vars import get_tokenizer
from rapidgpt.models.classification import build_gpt_classifier
from rapidgpt.tasks.pretraining import vocab_size
from rapidgpt.training.finetuner import Finetuner
from rapidgpt.training.metrics import evaluate_classification


def logits(model, batch):
    """`[b, classes]` logits of a batch of encoded texts."""
    return model(batch["tokens"], batch["position_ids"], batch["last_index"])


class SequenceClassificationFinetuner(Finetuner):

    def train_valid_test_datasets_provider(self):
        train, valid, test = classification_datasets(self.args, get_tokenizer(), self.logger)
        return train, valid, test, None

    def model_optimizer_lr_scheduler_provider(self):
        return build_gpt_classifier(self.args, vocab_size(self.args)), None, None

    def run_forward_step(self, batch, model):
        return ops.cross_entropy(logits(model, batch), batch["label"])

    def run_compute_metrics(self, model, eval_dataloader):
        return evaluate_classification(lambda batch: logits(model, batch), eval_dataloader, self.gather)


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
