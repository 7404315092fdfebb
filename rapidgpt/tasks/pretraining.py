"""`rapidgpt --task pretraining`: the built-in GPT or BERT on Megatron mmap data.

GPT: document-level data (`..._text_document`); with no data flags it trains on the embedded demo
corpus (Python's own documentation, see rapidgpt/data/demo_corpus.py) and finishes by printing a
continuation of a prompt. BERT (--model-type bert, the default with --tokenizer-type
BertWordPiece*, as Rapidformer's BERT examples): sentence-level data (`..._text_sentence`, from
preprocess_data.py --split-sentences), Megatron's pretrain_bert: masked-LM loss plus the
sentence-order loss (unless --bert-no-binary-head), logged as "lm loss" and "sop loss".
"""
import logging
from functools import partial

from rapidgpt.arguments import parse_args
from rapidgpt.data.bert_dataset import BertDatasetConfig
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.demo_chats import demo_chats
from rapidgpt.data.demo_corpus import demo_corpus
from rapidgpt.data.fim import fim_config
from rapidgpt.data.gpt_dataset import GPTDatasetConfig
from rapidgpt.data.mock_dataset import MockCorpus
from rapidgpt.data.sft_dataset import build_sft_datasets
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.errors import UserError
from rapidgpt.global_vars import get_tokenizer
from rapidgpt.models.bert import bert_loss_func, build_bert_model
from rapidgpt.models.distillation import build_distillation_model, distillation_loss, student_of
from rapidgpt.models.generation import generate, generate_ids
from rapidgpt.models.gpt import build_gpt_model, lm_loss_func
from rapidgpt.tokenizer.chat_template import ChatTemplate
from rapidgpt.training.pretrainer import Pretrainer, next_batch

DEMO_PROMPT = "The assert statement"


def vocab_size(args):
    tokenizer = get_tokenizer()
    if tokenizer is not None:
        return tokenizer.vocab_size
    if args.vocab_size is None:             # the flag check asks for one before (rapidgpt/arguments.py)
        raise UserError("--tokenizer-type: pretraining needs a vocabulary; give --tokenizer-type with "
                        "--vocab-file (and --merge-file) or --tokenizer-model, or --vocab-size if the data "
                        "holds token ids only")
    return args.vocab_size


def gpt_dataset_config(args):
    tokenizer = get_tokenizer()
    return GPTDatasetConfig(seq_length=args.seq_length, seed=args.seed,
                            eod=tokenizer.eod if tokenizer is not None else None,
                            eod_mask_loss=args.eod_mask_loss, reset_position_ids=args.reset_position_ids,
                            reset_attention_mask=args.reset_attention_mask,
                            data_cache_path=args.data_cache_path,
                            fim=fim_config(args, tokenizer, logging.getLogger("rapidgpt").warning))


def mock_corpus(args):
    """--mock-data's documents for this run's tokenizer, or None."""
    if not args.mock_data:
        return None
    tokenizer = get_tokenizer()
    return MockCorpus(tokenizer.vocab_size, tokenizer.eod)


class GPTPretrainer(Pretrainer):
    """The Megatron GPT example (pretrain_gpt.py) as a Pretrainer."""

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        args = self.args
        if args.sft:            # .jsonl conversations, loss on the answers (rapidgpt/data/sft_dataset.py)
            return build_sft_datasets(args, get_tokenizer(), train_val_test_num_samples, self.logger)
        return build_train_valid_test_datasets(
            gpt_dataset_config(args), train_val_test_num_samples, data_path=args.data_path,
            split=args.split, train_data_path=args.train_data_path,
            valid_data_path=args.valid_data_path, test_data_path=args.test_data_path, mock=mock_corpus(args))

    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        model = build_gpt_model(self.args, vocab_size(self.args), pre_process, post_process, vp_stage)
        if self.args.distillation is not None:         # --export-kd-teacher-load
            model = build_distillation_model(self.args, model)
        return model, None, None

    def run_forward_step(self, data_iterator, model):
        batch = next_batch(data_iterator)
        attention_mask = batch["attention_mask"] if "attention_mask" in batch else None
        output = model(batch["tokens"], batch["position_ids"], attention_mask, batch["labels"])
        if self.args.distillation is not None:
            return output, distillation_loss(self.args, model, batch["loss_mask"])
        return output, partial(lm_loss_func, batch["loss_mask"], per_token=self.args.calculate_per_token_loss)


def bert_dataset_config(args):
    return BertDatasetConfig.from_tokenizer(
        get_tokenizer(), seq_length=args.seq_length, seed=args.seed, mask_prob=args.mask_prob,
        short_seq_prob=args.short_seq_prob, binary_head=args.bert_binary_head, data_cache_path=args.data_cache_path)


class BertPretrainer(Pretrainer):
    """The Megatron BERT example (pretrain_bert.py) as a Pretrainer."""

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        args = self.args
        return build_train_valid_test_datasets(
            bert_dataset_config(args), train_val_test_num_samples, data_path=args.data_path,
            split=args.split, train_data_path=args.train_data_path,
            valid_data_path=args.valid_data_path, test_data_path=args.test_data_path)

    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        return (build_bert_model(self.args, vocab_size(self.args), pre_process, post_process, vp_stage=vp_stage),
                None, None)

    def run_forward_step(self, data_iterator, model):
        batch = next_batch(data_iterator)
        output = model(batch["text"], batch["padding_mask"], batch["types"], batch["labels"])
        return output, partial(bert_loss_func, batch["loss_mask"], batch["is_random"])


def chat_answer(args, model, tokenizer, prompt):
    """The model's answer to the user turn `prompt` (--chat, and after --sft), as text: the run's chat
    template with its generation prompt, stopped at its end-of-turn token."""
    template = ChatTemplate.of_run(args)
    new = generate_ids(model, template.prompt_ids(tokenizer, prompt), args.max_new_tokens,
                       template.stop_sequences(tokenizer), args.top_k, args.top_p, args.temperature, args.seed)
    return tokenizer.detokenize(new)


def use_demo_corpus(args):
    """No data flags: point the data and tokenizer flags at the embedded demo corpus."""
    paths = demo_corpus()
    args.data_path = [paths["data_prefix"]]
    args.tokenizer_type = "GPT2BPETokenizer"
    args.vocab_file, args.merge_file = paths["vocab_file"], paths["merge_file"]
    if args.prompt is None:
        args.prompt = DEMO_PROMPT


def before_launch(args):
    """Once per node, before its ranks start: build the demo corpus (or conversations) they will read
    (rather than every rank building it at the same moment)."""
    if not (args.data_path or args.train_data_path or args.mock_data):
        demo_chats() if args.sft else demo_corpus()


def main(argv=None, args=None):
    """Run the task on `argv` (default: the command line), or on the already parsed `args`."""
    args = args if args is not None else parse_args(argv=argv)
    bert = args.model_type == "bert"
    if args.sft and not (args.data_path or args.train_data_path):
        args.data_path = [demo_chats()]        # the embedded demo conversations (rapidgpt/data/demo_chats.py)
    elif not (args.data_path or args.train_data_path or args.mock_data):     # (BERT: refused by check_bert_args)
        use_demo_corpus(args)
    engine = RapidGPTEngine(args=args)
    trainer = (BertPretrainer if bert else GPTPretrainer)(engine)
    model = trainer.train()
    if bert:
        return 0
    wants_sample = args.prompt is not None and get_tokenizer() is not None and args.max_new_tokens
    if wants_sample and args.pipeline_model_parallel_size > 1:
        trainer.logger.info(" no sample continuation: each pipeline stage holds part of the model "
                            "(generation runs on a whole model, in one process)")
    elif wants_sample and args.sequence_parallel:
        trainer.logger.info(" no sample continuation: --sequence-parallel splits the sequence over the TP "
                            "ranks (generate from the checkpoint with --task text_generation)")
    elif wants_sample:
        how = f"top-k {args.top_k}, temperature {args.temperature}" if args.top_k else "greedy"
        if args.sft:
            answer = chat_answer(args, student_of(model), get_tokenizer(), args.prompt)
            trainer.logger.info(f"\nprompt: {args.prompt!r}\nanswer ({how}): {answer!r}")
        else:
            text = generate(student_of(model), get_tokenizer(), args.prompt, args.max_new_tokens, top_k=args.top_k,
                            top_p=args.top_p, temperature=args.temperature, seed=args.seed)
            trainer.logger.info(f"\nprompt: {args.prompt!r}\ncontinuation ({how}): {text!r}")
    return 0
