"""Pretrain a GPT on Megatron mmap data: Megatron-LM's `pretrain_gpt.py`, as a RapidGPT Pretrainer.

    rapidgpt --user-script user_scripts/pretrain_gpt.py \
        --data-path my-corpus_text_document \
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \
        --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 \
        --micro-batch-size 8 --global-batch-size 16 --train-iters 500 --lr 3e-4 ...

(see launch/pretrain_gpt.sh for a complete command line, on the embedded demo corpus).

A Pretrainer fills in three hooks, exactly the three functions of Megatron's example:

    train_valid_test_datasets_provider  ->  the train/valid/test GPT datasets (mmap .bin/.idx)
    model_optimizer_lr_scheduler_provider  ->  the model (optimizer/scheduler None: from the flags)
    run_forward_step  ->  one micro-batch through the model, and how to turn the output into a loss

The engine owns everything else: the loop, gradient accumulation over --global-batch-size,
clipping, the learning-rate schedule, evaluation every --eval-interval, logging, TensorBoard.
"""
import sys
from functools import partial

from rapidgpt import Pretrainer, RapidGPTEngine, get_args, get_tokenizer, next_batch
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.fim import fim_config
from rapidgpt.data.gpt_dataset import GPTDatasetConfig
from rapidgpt.data.mock_dataset import MockCorpus
from rapidgpt.data.sft_dataset import build_sft_datasets
from rapidgpt.models import build_distillation_model, build_gpt_model, distillation_loss


# ----------------------------------------------------------------------------------------------
# Batch and loss: Megatron's get_batch() and loss_func()
# ----------------------------------------------------------------------------------------------

def get_batch(data_iterator):
    """The next micro-batch, split into what the model takes.

    Megatron writes `next(data_iterator)`. Here the training step is compiled (mindspore.jit),
    and `next_batch` is what works both while compiling (it returns the micro-batch being traced)
    and in plain Python. Each field is a Tensor `[micro_batch_size, seq_length]` made by the
    GPT dataset: `tokens` and `labels` (the same text shifted by one), `loss_mask` (0 where a
    token must not count, e.g. with --eod-mask-loss), `position_ids`, and `attention_mask`
    only when --reset-attention-mask asks for per-document masks (otherwise the model is causal).
    """
    batch = next_batch(data_iterator)
    tokens = batch["tokens"]
    labels = batch["labels"]
    loss_mask = batch["loss_mask"]
    position_ids = batch["position_ids"]
    attention_mask = batch["attention_mask"] if "attention_mask" in batch else None
    return tokens, labels, loss_mask, attention_mask, position_ids


def loss_func(loss_mask, output_tensor):
    """Megatron's loss_func: the cross-entropy summed over the tokens where loss_mask is 1, and
    their number. The engine divides the sum by the micro-batch's tokens (the mean, by default) or,
    with --calculate-per-token-loss, by all the tokens of the step.

    `output_tensor` is the per-token loss `[b, s]` the GPT returns when given labels.
    (Megatron also returns `{"lm loss": ...}` for logging; RapidGPT logs the loss as "lm loss"
    itself.)
    """
    loss_mask = loss_mask.astype(output_tensor.dtype)
    return (output_tensor * loss_mask).sum(), loss_mask.sum()


# ----------------------------------------------------------------------------------------------
# The Pretrainer
# ----------------------------------------------------------------------------------------------

class MegatronGPTPretrainer(Pretrainer):

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        """Megatron's GPT datasets from --data-path (cut by --split) or --train/valid/test-data-path,
        or Megatron's mock documents with --mock-data; with --sft, conversations (.jsonl files).

        `train_val_test_num_samples` says how many samples each split must yield (train iters x
        global batch, and so on for the evaluations); a split smaller than that wraps around in
        new epochs, shuffled with --seed, as in Megatron. Every rank calls this; with several
        ranks, rank 0 builds the index cache while the others wait (the cache directory,
        --data-cache-path or `cache/` beside the data, must be visible to every rank).
        """
        args = self.args
        tokenizer = get_tokenizer()
        if args.sft:     # Megatron's --sft: .jsonl conversations, the loss on the answers, packed
            return build_sft_datasets(args, tokenizer, train_val_test_num_samples, self.logger)
        config = GPTDatasetConfig(
            seq_length=args.seq_length,
            seed=args.seed,
            eod=tokenizer.eod if tokenizer is not None else None,
            eod_mask_loss=args.eod_mask_loss,
            reset_position_ids=args.reset_position_ids,
            reset_attention_mask=args.reset_attention_mask,
            data_cache_path=args.data_cache_path,
            fim=fim_config(args, tokenizer, self.logger.warning),     # --fim-data (rapidgpt/data/fim.py)
        )
        train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
            config, train_val_test_num_samples,
            data_path=args.data_path, split=args.split,
            train_data_path=args.train_data_path,
            valid_data_path=args.valid_data_path,
            test_data_path=args.test_data_path,
            mock=MockCorpus(tokenizer.vocab_size, tokenizer.eod) if args.mock_data else None,
        )
        self.logger.info(f"> GPT datasets: train {len(train_ds)}, "
                         f"valid {len(valid_ds) if valid_ds else 0}, "
                         f"test {len(test_ds) if test_ds else 0} samples of {args.seq_length} tokens")
        return train_ds, valid_ds, test_ds

    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        """The built-in GPT, sized by --num-layers/--hidden-size/--num-attention-heads/...; with
        pipeline stages, this stage's part (`vp_stage`: its model chunk under the interleaved schedule).

        Returning None for the optimizer and the scheduler lets the engine build them from the
        flags (AdamW from --lr/--weight-decay/--adam-*, Megatron's warmup + decay schedule).
        """
        tokenizer = get_tokenizer()
        vocab_size = tokenizer.vocab_size if tokenizer is not None else self.args.vocab_size
        model = build_gpt_model(self.args, vocab_size, pre_process, post_process, vp_stage)
        if self.args.distillation is not None:   # --export-kd-teacher-load: Megatron's ModelOpt distillation
            model = build_distillation_model(self.args, model)
        return model, None, None

    def run_forward_step(self, data_iterator, model):
        """One micro-batch forward: Megatron's forward_step, returning (output, loss function).

        The engine calls the loss function on the output and differentiates the result. This
        method is compiled, so keep it to tensor code (no numpy, no printing of tensor values).
        """
        tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator)
        output_tensor = model(tokens, position_ids, attention_mask, labels)   # per-token loss [b, s]
        if self.args.distillation is not None:   # the student's and the teacher's per-token losses
            return output_tensor, distillation_loss(self.args, model, loss_mask)
        return output_tensor, partial(loss_func, loss_mask)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def usage_error(message):
    """Exit as argparse does for a bad command line: the message on stderr, status 2."""
    print(f"pretrain_gpt.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def check_data_flags(args):
    """This example trains on your mmap corpus (or Megatron's --mock-data): refuse to start without
    one, saying what to pass."""
    if not (args.data_path or args.train_data_path or args.mock_data):
        usage_error("--data-path PREFIX is required (a Megatron .bin/.idx prefix made by "
                    "data_tools/preprocess_data.py, e.g. my-corpus_text_document). To try it on the "
                    "embedded demo corpus run launch/pretrain_gpt.sh, or `rapidgpt --task pretraining`.")
    if get_tokenizer() is None and args.vocab_size is None:
        usage_error("the model needs a vocabulary: pass --tokenizer-type GPT2BPETokenizer "
                    "--vocab-file vocab.json --merge-file merges.txt (the ones the data was "
                    "preprocessed with), or --vocab-size if the data holds token ids only")


if __name__ == "__main__":
    engine = RapidGPTEngine()              # parses and validates the flags, seeds, builds the tokenizer
    check_data_flags(get_args())
    MegatronGPTPretrainer(engine=engine).train()
