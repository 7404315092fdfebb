"""Old Megatron-LM command lines (its pretrain_gpt.sh, pretrain_bert.sh, finetune_mnli_distributed.sh)
and Rapidformer's EasyNLP ones, read as they were written: the tokenizer inferred from the
vocabulary files, missing files named up front, several --valid-data files read in order, --task
handed to a --user-script. Flag checks, but for the user script's process and one process that
trains the old pretrain_gpt.sh and pretrain_bert.sh command lines, Megatron's Llama 3 example and its
FIM, muP, MLA and reruns functional tests end to end."""
import re
import subprocess
import sys
from argparse import Namespace

import pytest

from batched_runs import BatchedRuns
from rapidgpt.arguments import parse_args
from rapidgpt.config.implementation_choices import implementation_choice_lines
from rapidgpt.data.classification import classification_datasets
from rapidgpt.data.demo_corpus import demo_bert_corpus, demo_corpus
from test_parallel import REPO

# Megatron's examples/llama/train_llama3_8b_h100_fp8.sh (d98e8a6) in its default branch (no tokenizer or
# data given: --mock-data, NullTokenizer), every flag of it but the FP8 ones (DTYPE=bf16) and the
# launcher's, sizes made tiny, one process (the script's TP=2: tests/test_llama.py's layouts).
LLAMA3_MOCK = ["--use-mcore-models", "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "160",
               "--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16",
               "--seq-length", "64", "--max-position-embeddings", "64", "--position-embedding-type", "rope",
               "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0", "--hidden-dropout",
               "0.0", "--swiglu", "--normalization", "RMSNorm", "--init-method-std", "0.0134", "--attention-backend",
               "fused", "--apply-layernorm-1p", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
               "--micro-batch-size", "2", "--global-batch-size", "4", "--train-samples", "16", "--lr-decay-samples", "12",
               "--lr-warmup-samples", "4", "--lr", "0.00015", "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4",
               "--decoupled-min-lr", "4.5e-5", "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay",
               "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16",
               "--cross-entropy-loss-fusion", "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level",
               "1", "--exit-duration-in-mins", "235", "--context-parallel-size", "1", "--sequence-parallel",
               "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--mock-data",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256", "--tiktoken-pattern", "v2", "--split",
               "'99,1,0'", "--no-create-attention-mask-in-dataloader", "--no-mmap-bin-files", "--num-workers", "1",
               "--log-interval", "1", "--eval-iters", "2", "--eval-interval", "2", "--save-interval", "1000",
               "--log-throughput", "--profile", "--profile-step-start", "4", "--profile-step-end", "6", "--ckpt-format",
               "torch_dist", "--distributed-timeout-minutes", "60"]

# Megatron's functional test gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset (its model_config.yaml at
# d98e8a6), every flag but the paths, sizes made tiny: GPT-2 BPE files (the demo's) and --fim-data.
FIM_CONFIG = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--log-params-norm",
              "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard",
              "--micro-batch-size", "4", "--global-batch-size", "8", "--seq-length", "64", "--max-position-embeddings",
              "64", "--train-iters", "4", "--timing-log-level", "0", "--lr-decay-iters", "320000", "--split", "949,50,1",
              "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5",
              "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr-warmup-fraction", ".01", "--log-interval", "1",
              "--save-interval", "10000", "--eval-interval", "1000", "--eval-iters", "2", "--transformer-impl",
              "transformer_engine", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
              "--use-distributed-optimizer", "--deterministic-mode", "--no-gradient-accumulation-fusion",
              "--attention-softmax-in-fp32", "--use-mcore-models", "--ckpt-format", "torch_dist",
              "--dist-ckpt-strictness", "log_all", "--bf16", "--attention-backend", "unfused",
              "--log-memory-to-tensorboard", "--fim-data", "--fim-rate", "0.5", "--fim-spm-rate", "0.5", "--async-save",
              "--use-persistent-ckpt-worker"]

# gpt3_mcore_te_tp1_pp1_mup: the same flags as the FIM test's but --fim-*, with --no-mmap-bin-files and muP
# (hidden 512 over base 256 there, 32 over 16 here: width multiplier 2).
MUP_CONFIG = FIM_CONFIG[:FIM_CONFIG.index("--fim-data")] + ["--async-save", "--use-persistent-ckpt-worker",
                                                           "--no-mmap-bin-files", "--use-mup", "--mup-base-hidden-size",
                                                           "16"]

# gpt3_mcore_reruns_persistent_1 (d98e8a6), every flag but the paths, sizes made tiny, one process (its PP=2:
# tests/test_llama.py's layouts), and its --error-injection-rate 100 made 1, so that the error is injected in
# the first checked step (iteration 2) rather than in one of its 50 iterations.
RERUNS_PERSISTENT = ["--deterministic-mode", "--bf16", "--train-iters", "4", "--eval-iters", "0", "--manual-gc",
                     "--use-mcore-models", "--distributed-backend", "nccl", "--sequence-parallel",
                     "--tensor-model-parallel-size", "1", "--micro-batch-size", "1", "--global-batch-size", "4",
                     "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--rotary-percent",
                     "1.0", "--max-position-embeddings", "64", "--num-layers", "2", "--hidden-size", "64",
                     "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--num-query-groups", "2", "--seq-length",
                     "64", "--kv-channels", "16", "--group-query-attention", "--normalization", "RMSNorm", "--swiglu",
                     "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--no-create-attention-mask-in-dataloader",
                     "--transformer-impl", "transformer_engine", "--disable-bias-linear", "--clip-grad", "1.0",
                     "--overlap-grad-reduce", "--overlap-param-gather", "--lr", "3e-4", "--lr-warmup-samples", "0",
                     "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--use-distributed-optimizer",
                     "--split", "949,50,1", "--no-gradient-accumulation-fusion", "--save-interval", "10000",
                     "--eval-interval", "1000", "--ckpt-format", "torch_dist", "--dist-ckpt-strictness", "log_all",
                     "--timing-log-level", "0", "--log-interval", "1", "--log-params-norm", "--log-num-zeros-in-grad",
                     "--log-validation-ppl-to-tensorboard", "--log-timers-to-tensorboard", "--log-memory-to-tensorboard",
                     "--rerun-mode", "validate_results", "--error-injection-rate", "1", "--error-injection-type",
                     "persistent_error", "--async-save", "--use-persistent-ckpt-worker"]

# gpt3_mcore_te_tp2_pp2_mla (d98e8a6), every flag but the paths, sizes made tiny (its ratios kept: 8 heads, latent
# ranks 3/8 and 1/8 of the hidden size, 16 + 8 query/key channels and 16 value channels per head halved), one
# process (its TP=2 x PP=2 with --sequence-parallel: tests/test_llama.py's MLA layout).
MLA_CONFIG = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--multi-latent-attention",
              "--q-lora-rank", "24", "--kv-lora-rank", "8", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
              "--v-head-dim", "8", "--log-params-norm", "--log-num-zeros-in-grad", "--log-validation-ppl-to-tensorboard",
              "--log-timers-to-tensorboard", "--micro-batch-size", "4", "--global-batch-size", "8", "--seq-length", "64",
              "--max-position-embeddings", "64", "--train-iters", "4", "--timing-log-level", "0", "--lr-decay-iters",
              "320000", "--split", "949,50,1", "--distributed-backend", "nccl", "--lr", "0.00015", "--lr-decay-style",
              "cosine", "--min-lr", "1.0e-5", "--weight-decay", "1e-2", "--clip-grad", "1.0", "--lr-warmup-fraction",
              ".01", "--log-interval", "1", "--save-interval", "25", "--eval-interval", "1000", "--eval-iters", "2",
              "--transformer-impl", "transformer_engine", "--tensor-model-parallel-size", "1",
              "--pipeline-model-parallel-size", "1", "--sequence-parallel", "--untie-embeddings-and-output-weights",
              "--deterministic-mode", "--no-gradient-accumulation-fusion", "--attention-softmax-in-fp32",
              "--use-mcore-models", "--ckpt-format", "torch_dist", "--bf16", "--attention-backend", "unfused",
              "--log-memory-to-tensorboard", "--async-save", "--use-persistent-ckpt-worker"]

# Megatron's examples/pretrain_gpt.sh and pretrain_bert.sh (v2-v3), sizes made tiny, paths local.
OLD_GPT = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--micro-batch-size", "4",
           "--global-batch-size", "8", "--seq-length", "64", "--max-position-embeddings", "64", "--train-iters", "4",
           "--lr-decay-iters", "320000", "--data-impl", "mmap", "--split", "949,50,1", "--distributed-backend", "nccl",
           "--lr", "0.00015", "--min-lr", "1.0e-5", "--lr-decay-style", "cosine", "--weight-decay", "1e-2",
           "--clip-grad", "1.0", "--lr-warmup-fraction", ".01", "--checkpoint-activations", "--log-interval", "1",
           "--eval-interval", "1000", "--eval-iters", "10", "--fp16"]
OLD_BERT = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--micro-batch-size", "4",
            "--global-batch-size", "8", "--seq-length", "64", "--max-position-embeddings", "64", "--train-iters", "4",
            "--lr-decay-iters", "990000", "--data-impl", "mmap", "--split", "949,50,1", "--lr", "0.0001",
            "--min-lr", "0.00001", "--lr-decay-style", "linear", "--lr-warmup-fraction", ".01", "--weight-decay",
            "1e-2", "--clip-grad", "1.0", "--log-interval", "1", "--save-interval", "10000", "--eval-interval", "1000",
            "--eval-iters", "10", "--fp16"]


def files(tmp_path, *names):
    for name in names:
        (tmp_path / name).write_text("x\n")
    (tmp_path / "corpus_text_document.idx").write_bytes(b"")
    return [str(tmp_path / name) for name in names]


def test_gpt2_vocabulary_files_without_a_type_are_megatrons_gpt2_bpe(tmp_path):
    vocab, merges = files(tmp_path, "gpt2-vocab.json", "gpt2-merges.txt")
    args = parse_args(argv=["--task", "pretraining", *OLD_GPT, "--data-path", str(tmp_path / "corpus_text_document"),
                            "--vocab-file", vocab, "--merge-file", merges])
    assert (args.tokenizer_type, args.model_type) == ("GPT2BPETokenizer", "gpt")
    assert (" > --tokenizer-type not given: GPT2BPETokenizer, from --vocab-file and --merge-file, as Megatron's "
            "pretrain_gpt.py defaulted it") in implementation_choice_lines(args)


def test_a_wordpiece_vocabulary_without_a_type_is_megatrons_bert(tmp_path):
    vocab, = files(tmp_path, "bert-vocab.txt")
    args = parse_args(argv=["--task", "pretraining", *OLD_GPT, "--data-path", str(tmp_path / "corpus_text_document"),
                            "--vocab-file", vocab])
    assert (args.tokenizer_type, args.model_type) == ("BertWordPieceLowerCase", "bert")


@pytest.mark.parametrize("given, message", [
    (["--vocab-file", "/no/gpt2-vocab.json", "--merge-file", "/no/gpt2-merges.txt"],
     ["--vocab-file: /no/gpt2-vocab.json: no such file; check the path",
      "--merge-file: /no/gpt2-merges.txt: no such file; check the path"]),
    (["--vocab-file", "/no/bert-vocab.txt"], ["--vocab-file: /no/bert-vocab.txt: no such file; check the path"]),
    (["--vocab-file", "/no/gpt2-vocab.json"],
     ["--merge-file: --vocab-file /no/gpt2-vocab.json is a GPT-2 vocabulary, which needs its merges; give "
      "--merge-file merges.txt (or --tokenizer-type)"]),
    ([], ["--tokenizer-type: pretraining on --data-path needs its vocabulary; give --tokenizer-type with "
          "--vocab-file (and --merge-file) or --tokenizer-model, or --vocab-size if the data holds token ids only"]),
])
def test_missing_vocabulary_files_are_named_up_front(tmp_path, capsys, given, message):
    files(tmp_path)
    with pytest.raises(SystemExit) as e:
        parse_args(argv=["--task", "pretraining", *OLD_GPT, "--data-path", str(tmp_path / "corpus_text_document"),
                         *given])
    assert e.value.code == 2
    errors = [line.removeprefix("rapidgpt: error: ") for line in capsys.readouterr().err.strip().split("\n")[:-1]]
    assert errors == message


def test_several_valid_data_files_are_read_in_order(tmp_path):
    """finetune_mnli_distributed.sh: --valid-data dev_matched.tsv dev_mismatched.tsv."""
    train, matched, mismatched = (str(tmp_path / n) for n in ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv"))
    (tmp_path / "train.tsv").write_text("text\tlabel\na\tpos\nb\tneg\n")
    (tmp_path / "dev_matched.tsv").write_text("text\tlabel\nc\tneg\n")
    (tmp_path / "dev_mismatched.tsv").write_text("text\tlabel\nd\tpos\ne\tpos\n")
    vocab, merges = files(tmp_path, "vocab.json", "merges.txt")
    args = parse_args(argv=["--task", "sequence_classification", "--train-data", train, "--valid-data", matched,
                            mismatched, "--epochs", "1", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                            "--merge-file", merges])
    assert args.valid_data_path == [matched, mismatched]

    class Characters:
        def tokenize(self, text):
            return [ord(c) for c in text]
        eod = pad = 0
    args = Namespace(data_path=None, train_data_path=[train], valid_data_path=[matched, mismatched],
                     test_data_path=None, labels=None, num_classes=None, seq_length=8)
    _, valid, _ = classification_datasets(args, Characters())
    assert [valid[i]["label"] for i in range(3)] == [0, 1, 1]          # neg, then pos, pos


def test_task_with_a_user_script_is_the_scripts(tmp_path):
    """Rapidformer's EasyNLP scripts pass --task with --user-script: the script gets it as args.task.
    A flag of the script's own that Megatron also has (--exit-on-missing-checkpoint here) is the script's."""
    script = tmp_path / "my_trainer.py"
    script.write_text("from rapidgpt.arguments import parse_args\n"
                      "args = parse_args(lambda parser: parser.add_argument('--exit-on-missing-checkpoint', action='store_true'))\n"
                      "print('task:', args.task, 'exit:', args.exit_on_missing_checkpoint)\n")
    out = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--user-script", str(script), "--task",
                          "text_classify", "--train-iters", "1", "--exit-on-missing-checkpoint"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("task: text_classify exit: True")


def test_a_task_that_is_not_one_is_named(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "pretrainig", "--train-iters", "4"])
    assert "--task: pretrainig is not a task; did you mean pretraining? choose one of" in capsys.readouterr().err


@pytest.fixture(scope="module")
def old_scripts(env, tmp_path_factory):
    """pretrain_gpt.sh's flags with the demo corpus's GPT-2 vocabulary and merges, and
    pretrain_bert.sh's with its WordPiece vocabulary and sentence data, neither naming a tokenizer
    or a model, as `rapidgpt --task pretraining` (Megatron's `python pretrain_gpt.py` /
    `pretrain_bert.py`), one after the other in one process -> {name: (exit status, output)}."""
    gpt, bert = demo_corpus(cache_dir=env["RAPIDGPT_CACHE_DIR"]), demo_bert_corpus(cache_dir=env["RAPIDGPT_CACHE_DIR"])
    lines = {"gpt": ["--task", "pretraining", *OLD_GPT, "--data-path", gpt["data_prefix"], "--vocab-file",
                     gpt["vocab_file"], "--merge-file", gpt["merge_file"]],
             "bert": ["--task", "pretraining", *OLD_BERT, "--data-path", bert["data_prefix"], "--vocab-file",
                      bert["vocab_file"]]}
    folder = tmp_path_factory.mktemp("old_scripts")
    lines["llama3_mock"] = ["--task", "pretraining", *LLAMA3_MOCK, "--data-cache-path", str(folder / "cache"),
                            "--save", str(folder / "ckpt"), "--load", str(folder / "ckpt"),
                            "--tensorboard-dir", str(folder / "tb")]
    lines["fim"] = ["--task", "pretraining", *FIM_CONFIG, "--data-path", gpt["data_prefix"], "--vocab-file",
                    gpt["vocab_file"], "--merge-file", gpt["merge_file"], "--data-cache-path", str(folder / "fim_cache"),
                    "--load", str(folder / "fim_ckpt")]
    lines["mup"] = ["--task", "pretraining", *MUP_CONFIG, "--data-path", gpt["data_prefix"], "--vocab-file",
                    gpt["vocab_file"], "--merge-file", gpt["merge_file"], "--data-cache-path", str(folder / "mup_cache"),
                    "--load", str(folder / "mup_ckpt")]
    lines["reruns"] = ["--task", "pretraining", *RERUNS_PERSISTENT, "--data-path", gpt["data_prefix"], "--vocab-file",
                       gpt["vocab_file"], "--merge-file", gpt["merge_file"], "--data-cache-path",
                       str(folder / "reruns_cache"), "--save", str(folder / "reruns_ckpt"), "--load",
                       str(folder / "reruns_ckpt"), "--tensorboard-dir", str(folder / "reruns_tb")]
    lines["mla"] = ["--task", "pretraining", *MLA_CONFIG, "--data-path", gpt["data_prefix"], "--vocab-file",
                    gpt["vocab_file"], "--merge-file", gpt["merge_file"], "--data-cache-path", str(folder / "mla_cache"),
                    "--save", str(folder / "mla_ckpt"), "--load", str(folder / "mla_ckpt"), "--tensorboard-dir",
                    str(folder / "mla_tb")]
    runs = BatchedRuns(env, folder, [(1, argv) for argv in lines.values()])
    return {name: runs(1, argv)[:2] for name, argv in lines.items()}


@pytest.mark.parametrize("script", ["gpt", "bert"])
def test_the_old_pretraining_scripts_train_their_model(old_scripts, script):
    """Each trains its 4 iterations (fp16 from Megatron's initial loss scale 2^32, as the scripts'
    --fp16: these first steps are skipped while the scale comes down, and print no loss) and
    validates its own model at the end: BERT's line has the sentence-order loss, GPT's none."""
    status, log = old_scripts[script]
    assert status == 0, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1", "2", "3", "4"], log[-3000:]
    assert ("tokenizer-type not given: GPT2BPETokenizer" if script == "gpt" else
            "tokenizer-type not given: BertWordPieceLowerCase") in log
    validation = [line for line in log.splitlines() if "validation loss at" in line]
    assert validation and "lm loss value:" in validation[-1], log[-3000:]
    assert ("sop loss value:" in validation[-1]) == (script == "bert"), validation[-1]


def test_megatrons_llama3_example_trains_in_its_default_mock_data_branch(old_scripts):
    """Its --bf16 (emulated here) with --grad-reduce-in-bf16, Megatron's mock documents under
    NullTokenizer cut "1,1,1" whatever its --split says (so there is test data), and each flag
    RapidGPT treats as an implementation choice saying so in one line."""
    status, log = old_scripts["llama3_mock"]
    assert status == 0, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1", "2", "3", "4"], log[-3000:]
    assert " > precision: emulated bf16 (fp32 tensors holding bf16 values" in log
    assert "validation loss at the end of training for test data" in log
    for flag in ("--use-mcore-models", "--attention-backend", "--profile", "--ckpt-format torch_dist"):
        assert f" > {flag}: accepted;" in log or f" > {flag} " in log, flag


def test_megatrons_fim_functional_test_trains(old_scripts):
    """--fim-data with Megatron's GPT-2 vocabulary files, which hold no FIM tokens: they are its
    unknown token <|endoftext|> (as in Megatron), said in one warning, and the run trains."""
    status, log = old_scripts["fim"]
    assert status == 0, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1", "2", "3", "4"], log[-3000:]
    assert "WARNING: --fim-prefix-token '<fim_prefix>', --fim-middle-token '<fim_middle>'" in log
    assert "validation loss at the end of training for val data" in log


def test_megatrons_mup_functional_test_trains(old_scripts):
    """--use-mup --mup-base-hidden-size at width multiplier 2 with Adam: the run says what muP
    scales (the hidden matrices' rate and eps by 1/2; logits by 1/2, attention by 1 / kv_channels)
    and trains."""
    status, log = old_scripts["mup"]
    assert status == 0, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1", "2", "3", "4"], log[-3000:]
    assert (" > muP: width multiplier 2, attention scale 0.125, embeddings x1, logits x0.5, hidden matrices' lr "
            "and Adam eps x0.5") in log
    assert " > muP's lr x0.5 for layers.*.mlp.dense_4h_to_h.weight, layers.*.mlp.dense_h_to_4h.weight, " \
           "layers.*.self_attention.dense.weight, layers.*.self_attention.query_key_value.weight" in log
    assert "validation loss at the end of training for val data" in log


def test_megatrons_reruns_functional_test_saves_and_exits_as_megatron(old_scripts):
    """The rerun state machine with an injected persistent error: the lines its AFTER_SCRIPT looks
    for, the checkpoint of iteration 1 to re-run iteration 2 from, and Megatron's exit code 16."""
    status, log = old_scripts["reruns"]
    assert status == 16, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1"], log[-3000:]
    for line in ("Result validation enabled", "Injecting error type Persistent error",
                 "First rerun: unexpected result is reproducible within the tolerance",
                 "Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun the last "
                 "iteration and establish a diagnostic", "successfully saved checkpoint at iteration       1"):
        assert line in log, line


def test_megatrons_mla_functional_test_trains(old_scripts):
    """Multi-latent attention with Megatron's MLA defaults beside the flags (YaRN at factor 1, no
    latent norms) on the learned-positions GPT: the run says what it builds and trains."""
    status, log = old_scripts["mla"]
    assert status == 0, log[-3000:]
    assert re.findall(r" iteration\s+(\d+)/\s*4 \|", log) == ["1", "2", "3", "4"], log[-3000:]
    assert (" > multi-latent attention: queries through a rank-24 latent, keys and values through a rank-8 latent; "
            "per head 8 + 4 (rotary, YaRN (factor 1, mscale 1, mscale_all_dim 0)) query/key channels, 8 value "
            "channels; scores x0.288675") in log
    assert "validation loss at the end of training for val data" in log
