"""Pretrain BERT on Megatron mmap data: Megatron-LM's `pretrain_bert.py`, as a RapidGPT Pretrainer.

    # sentence-level data first (one sequence per sentence; no download: Punkt learns the corpus)
    python data_tools/preprocess_data.py --input corpus.jsonl --output-prefix my-corpus \
        --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt --split-sentences --workers 2

    rapidgpt --user-script user_scripts/pretrain_bert.py \
        --data-path my-corpus_text_sentence \
        --tokenizer-type BertWordPieceLowerCase --vocab-file vocab.txt \
        --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
        --micro-batch-size 8 --global-batch-size 16 --train-iters 500 --lr 1e-4 ...

(launch/pretrain_bert.sh makes such a corpus from the embedded demo documents and runs this.)

The three hooks are Megatron's three functions:

    train_valid_test_datasets_provider  ->  BERT samples (BertDataset: sentence pairs, masking)
    model_optimizer_lr_scheduler_provider  ->  the built-in BERT (optimizer/scheduler from the flags)
    run_forward_step  ->  one micro-batch through the model, and Megatron's BERT loss function

The loss function returns `(loss, {"lm loss": ..., "sop loss": ...})` as Megatron's does: the
engine logs those two numbers (training and validation lines) instead of the summed loss.
BERT flags: --mask-prob (0.15), --short-seq-prob (0.1), --bert-no-binary-head (masked LM only).
"""
import sys
from functools import partial

from rapidgpt import Pretrainer, RapidGPTEngine, get_args, get_tokenizer, next_batch
from rapidgpt.data.bert_dataset import BertDatasetConfig
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.models.bert import build_bert_model

# MindSpore after rapidgpt: importing rapidgpt sets OMP_WAIT_POLICY before MindSpore loads OpenMP
# (rapidgpt/config/kernel_fusion.py)
from mindspore import ops
import mindspore as ms


# ----------------------------------------------------------------------------------------------
# Batch and loss: Megatron's get_batch() and loss_func()
# ----------------------------------------------------------------------------------------------

def get_batch(data_iterator):
    """The next micro-batch, Megatron's names: `text` (input ids, some masked), `types` (token
    types 0/1), `labels` (the original ids at masked positions, -1 elsewhere), `loss_mask`,
    `padding_mask` (1 = token, 0 = padding), `is_random` (1 when A and B were swapped: the
    sentence-order label). Each `[micro_batch_size, seq_length]`, `is_random` `[micro_batch_size]`."""
    batch = next_batch(data_iterator)
    return (batch["text"], batch["types"], batch["is_random"], batch["loss_mask"], batch["labels"],
            batch["padding_mask"])


def loss_func(loss_mask, sentence_order, output_tensor):
    """Masked-LM loss (mean over the masked positions) + sentence-order loss, and both for the log."""
    lm_loss_, sop_logits = output_tensor                  # per-token loss [b, s], logits [b, 2]
    loss_mask = loss_mask.astype(ms.float32)
    lm_loss = (lm_loss_.astype(ms.float32) * loss_mask).sum() / loss_mask.sum()
    if sop_logits is None:                                # --bert-no-binary-head
        return lm_loss, {"lm loss": lm_loss}
    sop_loss = ops.cross_entropy(sop_logits.astype(ms.float32), sentence_order.astype(ms.int32))
    return lm_loss + sop_loss, {"lm loss": lm_loss, "sop loss": sop_loss}


# ----------------------------------------------------------------------------------------------
# The Pretrainer
# ----------------------------------------------------------------------------------------------

class MegatronBertPretrainer(Pretrainer):

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        """BERT datasets from --data-path (a sentence-level prefix, cut by --split over documents)
        or --train/valid/test-data-path; the samples mapping is cached beside the data (or in
        --data-cache-path), built by rank 0 while the others wait."""
        args = self.args
        config = BertDatasetConfig.from_tokenizer(
            get_tokenizer(), seq_length=args.seq_length, seed=args.seed, mask_prob=args.mask_prob,
            short_seq_prob=args.short_seq_prob, binary_head=args.bert_binary_head,
            data_cache_path=args.data_cache_path)
        train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
            config, train_val_test_num_samples, data_path=args.data_path, split=args.split,
            train_data_path=args.train_data_path, valid_data_path=args.valid_data_path,
            test_data_path=args.test_data_path)
        self.logger.info(f"> BERT datasets: train {len(train_ds)}, valid {len(valid_ds) if valid_ds else 0}, "
                         f"test {len(test_ds) if test_ds else 0} samples of {args.seq_length} tokens")
        return train_ds, valid_ds, test_ds

    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        """The built-in BERT (rapidgpt/models/bert.py) sized by the model flags; this pipeline stage's
        part of it with --pipeline-model-parallel-size (`vp_stage`: its model chunk under the
        interleaved schedule)."""
        model = build_bert_model(self.args, get_tokenizer().vocab_size, pre_process, post_process,
                                 vp_stage=vp_stage)
        return model, None, None

    def run_forward_step(self, data_iterator, model):
        """Megatron's forward_step: the model returns the per-token LM loss and the binary logits."""
        tokens, types, sentence_order, loss_mask, lm_labels, padding_mask = get_batch(data_iterator)
        output_tensor = model(tokens, padding_mask, types, lm_labels)
        return output_tensor, partial(loss_func, loss_mask, sentence_order)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def usage_error(message):
    print(f"pretrain_bert.py: error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    engine = RapidGPTEngine()
    args = get_args()
    if not (args.data_path or args.train_data_path):
        usage_error("--data-path PREFIX is required: a sentence-level .bin/.idx prefix made by "
                    "data_tools/preprocess_data.py --split-sentences (e.g. my-corpus_text_sentence); "
                    "launch/pretrain_bert.sh makes one from the embedded demo documents")
    if get_tokenizer() is None or not args.tokenizer_type.startswith("BertWordPiece"):
        usage_error("BERT needs its WordPiece vocabulary: pass --tokenizer-type BertWordPieceLowerCase "
                    "(or BertWordPieceCase) --vocab-file vocab.txt, the one the data was preprocessed with")
    MegatronBertPretrainer(engine=engine).train()
