"""Which built-in model, and BERT's own flags (Megatron-LM's names).

    --model-type gpt|bert    the built-in model of --task pretraining / sequence_classification;
                             default: BERT when the tokenizer is a BERT WordPiece one (Rapidformer's
                             BERT examples give only --tokenizer-type BertWordPieceLowerCase), or
                             when --pretrained-checkpoint / --load holds a BERT; GPT otherwise
    --bert-no-binary-head    no sentence-order (binary) head and loss; samples are not split into A/B
                             (--bert-binary-head: with it, the default)
    --mask-prob 0.15         share of the tokens masked for the masked-LM loss
    --short-seq-prob 0.1     share of samples given a random shorter target length

The model type is recorded in checkpoints with the other architecture flags (a run that starts
from a checkpoint must agree); whether it has the binary head too, used when the flags do not say
(a checkpoint's heads that the model lacks are left unused).
"""
MODEL_TYPES = ("gpt", "bert")


def add_bert_args(parser):
    g = parser.add_argument_group("model type and BERT")
    g.add_argument("--model-type", choices=MODEL_TYPES, default=None,
                   help="the built-in model (default: bert with a BERT WordPiece tokenizer or a BERT "
                        "checkpoint, else gpt)")
    g.add_argument("--bert-no-binary-head", dest="bert_binary_head", action="store_false", default=True,
                   help="BERT without the sentence-order head and loss (masked LM only)")
    g.add_argument("--bert-binary-head", dest="bert_binary_head", action="store_true",
                   help="BERT with the sentence-order head (the default; overrides a checkpoint saved without one)")
    g.add_argument("--mask-prob", type=float, default=0.15,
                   help="BERT: probability of masking a token (of those, 80%% [MASK], 10%% random, 10%% kept)")
    g.add_argument("--short-seq-prob", type=float, default=0.1,
                   help="BERT: probability of a sample with a random target length shorter than --seq-length")


def default_model_type(tokenizer_type):
    return "bert" if (tokenizer_type or "").startswith("BertWordPiece") else "gpt"


def check_bert_args(args, check):
    """Validate into `check` (a flag_parser.Problems); settle `args.model_type`."""
    if args.model_type is None:
        args.model_type = default_model_type(args.tokenizer_type)
    check.require(0.0 < args.mask_prob < 1.0, f"--mask-prob: must be in (0, 1) (no masked token leaves the "
                                              f"masked-LM loss undefined), got {args.mask_prob}")
    check.require(0.0 <= args.short_seq_prob <= 1.0,
                  f"--short-seq-prob: must be in [0, 1], got {args.short_seq_prob}")
    if args.model_type == "bert":
        check.require(args.task != "text_generation", "--task text_generation: the checkpoint holds a BERT, an "
                                                      "encoder that does not generate text; load a GPT")
        check.require(args.task != "pretraining" or args.tokenizer_type,
                      "--tokenizer-type: BERT pretraining builds its samples with [CLS]/[SEP]/[MASK]; give "
                      "--tokenizer-type BertWordPieceLowerCase (or BertWordPieceCase) --vocab-file vocab.txt")
        check.require(not args.mock_data, "--mock-data: Megatron's mock documents are GPT data; BERT pretraining "
                                          "needs a sentence-level corpus (--data-path)")
        check.require(args.task != "pretraining" or args.data_path or args.train_data_path or args.mock_data,
                      "--data-path: BERT pretraining needs a sentence-level corpus (data_tools/preprocess_data.py "
                      "--split-sentences makes one, e.g. corpus_text_sentence); the embedded demo corpus is "
                      "the GPT's")
        check.require(not args.calculate_per_token_loss,
                      "--calculate-per-token-loss: the built-in BERT's losses (masked LM and sentence order) are "
                      "means of their own; drop the flag")
        check.require(not args.sequence_parallel,
                      "--sequence-parallel: the built-in BERT does not split the sequence; drop the flag")
        check.require(not args.untie_embeddings_and_output_weights,
                      "--untie-embeddings-and-output-weights: BERT's masked-LM output is tied to its word "
                      "embeddings; remove the flag")
        check.require(not args.tokenizer_type or args.tokenizer_type.startswith("BertWordPiece"),
                      f"--tokenizer-type: BERT needs [CLS]/[SEP]/[MASK]/[PAD] from a WordPiece vocabulary; "
                      f"give BertWordPieceLowerCase or BertWordPieceCase with --vocab-file vocab.txt, "
                      f"not {args.tokenizer_type}")
