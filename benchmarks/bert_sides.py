"""The BERT sides of benchmarks/bench_pretrain.py (`--model bert`): RapidGPT's BertPretrainer and a
plain-MindSpore BERT, on the same synthetic BERT batches.

Both train the same BERT (post-LayerNorm layers, exact GELU, masked-LM head tied to the word
embeddings, sentence-order head) with the bench's sizes (benchmarks/bench_pretrain.py MODELS), fp32,
dropout 0.1, AdamW, on items shaped like rapidgpt/data/bert_dataset.py's: 15% of the positions
predicted, token types 0 then 1, no padding, a random sentence-order label.
"""
import time

import numpy as np


class SyntheticBertDataset:
    """`num_samples` BERT items (rapidgpt/data/bert_dataset.py's fields), drawn once, up front."""

    def __init__(self, num_samples, seq_length, vocab_size, seed=1234):
        rng = np.random.default_rng(seed)
        p = 1.0 / np.arange(1, vocab_size + 1) ** 1.1
        self.text = rng.choice(vocab_size, size=(num_samples, seq_length), p=p / p.sum()).astype(np.int32)
        self.predicted = rng.random((num_samples, seq_length)) < 0.15
        self.labels = np.where(self.predicted, rng.choice(vocab_size, size=(num_samples, seq_length)), -1)
        self.is_random = rng.integers(0, 2, num_samples).astype(np.int32)
        self.types = np.repeat([[0] * (seq_length // 2) + [1] * (seq_length - seq_length // 2)], num_samples, 0)

    def __len__(self):
        return len(self.text)

    def __getitem__(self, i):
        return {"text": self.text[i], "types": self.types[i].astype(np.int32),
                "labels": self.labels[i].astype(np.int32), "loss_mask": self.predicted[i].astype(np.float32),
                "padding_mask": np.ones(self.text.shape[1], np.int32), "is_random": self.is_random[i]}


def run_rapidgpt_bert(opts, model, optim, engine_argv, clock, summarize, show_log):
    """RapidGPT's BertPretrainer (rapidgpt/tasks/pretraining.py) with its dataset hook replaced."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.engine import RapidGPTEngine
    from rapidgpt.global_vars import get_logger
    from rapidgpt.tasks.pretraining import BertPretrainer

    args = parse_args(argv=[str(a) for a in engine_argv + ["--model-type", "bert"]])
    engine = RapidGPTEngine(args=args)

    class SyntheticBertPretrainer(BertPretrainer):
        def train_valid_test_datasets_provider(self, train_val_test_num_samples):
            return SyntheticBertDataset(train_val_test_num_samples[0], args.seq_length, args.vocab_size), None, None

    logger = get_logger()
    if not show_log:
        logger.handlers.clear()
    logger.addHandler(clock)
    start = time.perf_counter()
    SyntheticBertPretrainer(engine).train()
    return start


def run_baseline_bert(opts, model, optim, summarize):
    """A plain BERT in MindSpore, GRAPH_MODE TrainOneStepCell (the bench's fastest plain loop)."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mindspore.common.initializer import Normal

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(opts.threads)
    ms.set_seed(1234)
    m, o = model, optim
    h, heads, s, v, p, eps = (m["hidden_size"], m["num_heads"], m["seq_length"], m["vocab_size"], m["dropout"],
                              m["layernorm_eps"])

    def dense(n_in, n_out, std=m["init_std"]):
        return nn.Dense(n_in, n_out, weight_init=Normal(std), bias_init="zeros")

    class Layer(nn.Cell):
        """Post-LayerNorm encoder layer with a padding mask `[b, 1, 1, s]` (0 = keep, -10000 = hide)."""

        def __init__(self):
            super().__init__()
            self.qkv, self.proj = dense(h, 3 * h), dense(h, h, m["init_std"] / (2 * m["num_layers"]) ** 0.5)
            self.fc1, self.fc2 = dense(h, 4 * h), dense(4 * h, h, m["init_std"] / (2 * m["num_layers"]) ** 0.5)
            self.ln1, self.ln2 = nn.LayerNorm((h,), epsilon=eps), nn.LayerNorm((h,), epsilon=eps)
            self.attn_drop, self.drop1, self.drop2 = nn.Dropout(p=p), nn.Dropout(p=p), nn.Dropout(p=p)
            self.bmm_qk, self.bmm_pv = ops.BatchMatMul(transpose_b=True), ops.BatchMatMul()
            self.gelu = nn.GELU(approximate=False)
            self.scale = (h // heads) ** -0.5

        def construct(self, x, mask):
            b = x.shape[0]
            qkv = self.qkv(x).reshape(b, s, 3, heads, h // heads).transpose(2, 0, 3, 1, 4)
            scores = self.bmm_qk(qkv[0], qkv[1]) * self.scale + mask
            context = self.bmm_pv(self.attn_drop(ops.softmax(scores, axis=-1)), qkv[2])
            x = self.ln1(x + self.drop1(self.proj(context.transpose(0, 2, 1, 3).reshape(b, s, h))))
            return self.ln2(x + self.drop2(self.fc2(self.gelu(self.fc1(x)))))

    class Bert(nn.Cell):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(v, h, embedding_table=Normal(m["init_std"]))
            self.wpe = nn.Embedding(s, h, embedding_table=Normal(m["init_std"]))
            self.wtt = nn.Embedding(2, h, embedding_table=Normal(m["init_std"]))
            self.positions = Tensor(np.arange(s, dtype=np.int32)[None])
            self.ln, self.drop = nn.LayerNorm((h,), epsilon=eps), nn.Dropout(p=p)
            self.layers = nn.CellList([Layer() for _ in range(m["num_layers"])])
            self.pooler, self.binary = dense(h, h), dense(h, 2)
            self.head_dense, self.head_ln = dense(h, h), nn.LayerNorm((h,), epsilon=eps)
            self.head_bias = ms.Parameter(Tensor(np.zeros(v, np.float32)), name="head_bias")
            self.gelu = nn.GELU(approximate=False)
            self.logits = ops.MatMul(transpose_b=True)

        def construct(self, text, types, padding_mask, labels, loss_mask, is_random):
            x = self.drop(self.ln(self.wte(text) + self.wpe(self.positions) + self.wtt(types)))
            mask = ((1.0 - padding_mask.astype(ms.float32)) * -10000.0).reshape(-1, 1, 1, s)
            for layer in self.layers:
                x = layer(x, mask)
            lm = self.logits(self.head_ln(self.gelu(self.head_dense(x))).reshape(-1, h), self.wte.embedding_table)
            per_token = ops.cross_entropy(lm + self.head_bias, ops.maximum(labels, 0).reshape(-1), reduction="none")
            mask_flat = loss_mask.reshape(-1)
            lm_loss = (per_token * mask_flat).sum() / mask_flat.sum()
            binary = self.binary(ops.tanh(self.pooler(x[:, 0])))
            return lm_loss + ops.cross_entropy(binary, is_random)

    start = time.perf_counter()
    net = Bert()
    params = net.trainable_params()
    decay = [q for q in params if q.ndim > 1]
    no_decay = [q for q in params if q.ndim <= 1]
    optimizer = nn.AdamWeightDecay([{"params": decay, "weight_decay": o["weight_decay"]},
                                    {"params": no_decay, "weight_decay": 0.0}],
                                   learning_rate=opts.lr, beta1=o["beta1"], beta2=o["beta2"], eps=o["eps"])
    train_net = nn.TrainOneStepCell(net, optimizer)
    train_net.set_train(True)
    total, mbs = opts.warmup + opts.iters, m["micro_batch_size"]
    dataset = SyntheticBertDataset(total * mbs, s, v)
    keys = ("text", "types", "padding_mask", "labels", "loss_mask", "is_random")
    end_times, losses, iter1_start = [], [], None
    for it in range(total):
        if it == 0:
            iter1_start = time.perf_counter()
        items = [dataset[i] for i in range(it * mbs, (it + 1) * mbs)]
        loss = train_net(*(Tensor(np.stack([x[k] for x in items])) for k in keys))
        losses.append(float(loss.asnumpy()))
        end_times.append(time.perf_counter())
    return summarize("baseline", end_times, losses, start, end_times[0] - iter1_start, mbs * s, opts.warmup,
                     opts.iters)
