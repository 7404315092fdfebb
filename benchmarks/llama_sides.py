"""The Llama sides of benchmarks/bench_pretrain.py (`--model llama`): the bench model's sizes as a
Llama-style decoder -- RoPE, RMSNorm, SwiGLU, grouped-query attention (2 query heads per key/value
head), no biases, untied output layer, no dropout -- trained three ways on the same data:

- rapidgpt: the bench's engine run with the Llama flags (`LLAMA_FLAGS`), the built-in decoder.
- plain MindSpore: the same model written below in MindSpore (GRAPH_MODE `nn.TrainOneStepCell`
  over `nn.AdamWeightDecay`, as the GPT's baseline).
- PyTorch eager: the same model written as a PyTorch user writes a Llama (Hugging Face's module
  names and rotary convention), started from RapidGPT's initial weights exported to those names
  by RapidGPT's own Hugging Face converter (rapidgpt/models/hf_llama.py), so that its first loss
  is RapidGPT's; torch.optim.AdamW over Megatron's groups, clip_grad_norm_.

torch is an optional benchmark extra (`pip install torch==2.13.0`), imported only in `run_torch_llama`.
"""
import time

import numpy as np

from torch_side import train_eager

ROTARY_BASE = 10000          # Megatron parses --rotary-base as an int


def llama_dims(m):
    """The Llama bench model from a bench_pretrain MODELS entry: 2 query heads per group, Megatron's
    SwiGLU width int(8h/3 / 64) * 64, no dropout."""
    return dict(m, dropout=0.0, num_query_groups=m["num_heads"] // 2,
                ffn_hidden_size=int(4 * m["hidden_size"] * 2 / 3 / 64) * 64)


def llama_flags(m):
    """The rapidgpt flags that make the bench's GPT this Llama."""
    return ["--position-embedding-type", "rope", "--rotary-base", ROTARY_BASE, "--normalization", "RMSNorm",
            "--swiglu", "--ffn-hidden-size", m["ffn_hidden_size"], "--group-query-attention",
            "--num-query-groups", m["num_query_groups"], "--disable-bias-linear",
            "--untie-embeddings-and-output-weights", "--norm-epsilon", m["layernorm_eps"]]


def write_initial_llama_weights(path, argv):
    """RapidGPT's initial weights of the bench Llama (`argv`: the engine's flags), under Hugging
    Face's names (RapidGPT's converter), into `path` (.npz)."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.models.hf_llama import rapidgpt_to_hf
    from rapidgpt.parallel.random import initialize_parameters
    from rapidgpt.training.checkpoint_files import ARCHITECTURE_ARGS

    args = parse_args(argv=[str(a) for a in argv])
    model = build_gpt_model(args, args.vocab_size)
    initialize_parameters(model, args.seed)
    flags = {name: getattr(args, name) for name in ARCHITECTURE_ARGS}
    np.savez(path, **rapidgpt_to_hf({p.name: p.asnumpy() for p in model.trainable_params()}, flags))


def _sizes(m):
    """hidden, query heads, query groups, sequence, vocabulary, head size of the bench Llama `m`."""
    h, a = m["hidden_size"], m["num_heads"]
    return h, a, m["num_query_groups"], m["seq_length"], m["vocab_size"], h // a


def _rotary_tables(s, d):
    """cos, sin [s, d] of the rotary angles (Hugging Face's layout: the half-angles repeated)."""
    inv_freq = 1.0 / ROTARY_BASE ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.outer(np.arange(s, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def run_torch_llama(opts, m, optim, weights_path, dataset, summarize):
    """PyTorch eager training of the bench Llama from the weights in `weights_path`."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(opts.threads)
    torch.manual_seed(1234)
    h, a, g, s, v, d = _sizes(m)
    eps = m["layernorm_eps"]
    cos, sin = (torch.from_numpy(t) for t in _rotary_tables(s, d))

    def rotate(x):                                        # x [b, heads, s, d]
        half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
        return x * cos + half * sin

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(h, a * d, bias=False)
            self.k_proj = nn.Linear(h, g * d, bias=False)
            self.v_proj = nn.Linear(h, g * d, bias=False)
            self.o_proj = nn.Linear(a * d, h, bias=False)

        def forward(self, x):
            b = x.shape[0]
            q = rotate(self.q_proj(x).view(b, s, a, d).transpose(1, 2))
            k = rotate(self.k_proj(x).view(b, s, g, d).transpose(1, 2))
            val = self.v_proj(x).view(b, s, g, d).transpose(1, 2)
            context = F.scaled_dot_product_attention(q, k, val, is_causal=True, enable_gqa=True)
            return self.o_proj(context.transpose(1, 2).reshape(b, s, a * d))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            f = m["ffn_hidden_size"]
            self.gate_proj = nn.Linear(h, f, bias=False)
            self.up_proj = nn.Linear(h, f, bias=False)
            self.down_proj = nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = RMSNorm(), Attention()
            self.post_attention_layernorm, self.mlp = RMSNorm(), MLP()

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(v, h)
            self.layers = nn.ModuleList(Layer() for _ in range(m["num_layers"]))
            self.norm = RMSNorm()

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Model()
            self.lm_head = nn.Linear(h, v, bias=False)

        def forward(self, tokens, labels):
            x = self.model.embed_tokens(tokens)
            for layer in self.model.layers:
                x = layer(x)
            logits = self.lm_head(self.model.norm(x))
            return F.cross_entropy(logits.view(-1, v), labels.reshape(-1))

    start = time.perf_counter()
    net = LlamaForCausalLM()
    weights = np.load(weights_path)
    state = net.state_dict()
    if sorted(weights.files) != sorted(state) or any(tuple(state[n].shape) != weights[n].shape for n in state):
        raise SystemExit(f"torch side: RapidGPT's exported weights {sorted(weights.files)} do not fit {sorted(state)}")
    net.load_state_dict({n: torch.from_numpy(np.ascontiguousarray(weights[n])) for n in state})
    return train_eager(net, opts, m, optim, dataset, summarize, start)


def run_baseline_llama(opts, m, optim, dataset, summarize):
    """The bench Llama written in plain MindSpore, trained as the GPT's baseline is."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops
    from mindspore.common.initializer import Normal

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.device_context.cpu.op_tuning.threads_num(opts.threads)
    ms.set_seed(1234)
    h, a, g, s, v, d = _sizes(m)
    eps, std = m["layernorm_eps"], m["init_std"]
    cos, sin = (Tensor(t) for t in _rotary_tables(s, d))

    def dense(n_in, n_out):
        return nn.Dense(n_in, n_out, weight_init=Normal(std), has_bias=False)

    class RMSNorm(nn.Cell):
        def __init__(self):
            super().__init__()
            self.weight = Parameter(Tensor(np.ones(h, np.float32)), name="weight")

        def construct(self, x):
            return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + eps) * self.weight

    def rotate(x):                                        # x [b, heads, s, d]
        half = ops.cat([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
        return x * cos + half * sin

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = dense(h, a * d), dense(h, g * d), dense(h, g * d), dense(a * d, h)
            self.bmm_qk = ops.BatchMatMul(transpose_b=True)
            self.bmm_pv = ops.BatchMatMul()
            self.mask = Tensor(np.triu(np.full((1, 1, s, s), -10000.0, np.float32), k=1))

        def construct(self, x):
            b = x.shape[0]
            q = rotate(self.q(x).reshape(b, s, a, d).transpose(0, 2, 1, 3))
            k = rotate(self.k(x).reshape(b, s, g, d).transpose(0, 2, 1, 3))
            val = self.v(x).reshape(b, s, g, d).transpose(0, 2, 1, 3)
            k, val = ops.repeat_interleave(k, a // g, 1), ops.repeat_interleave(val, a // g, 1)
            probs = ops.softmax(self.bmm_qk(q, k) * d ** -0.5 + self.mask, axis=-1)
            return self.o(self.bmm_pv(probs, val).transpose(0, 2, 1, 3).reshape(b, s, a * d))

    class Layer(nn.Cell):
        def __init__(self):
            super().__init__()
            f = m["ffn_hidden_size"]
            self.norm1, self.attn, self.norm2 = RMSNorm(), Attention(), RMSNorm()
            self.gate, self.up, self.down = dense(h, f), dense(h, f), dense(f, h)

        def construct(self, x):
            x = x + self.attn(self.norm1(x))
            y = self.norm2(x)
            return x + self.down(ops.silu(self.gate(y)) * self.up(y))

    class Llama(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(v, h, embedding_table=Normal(std))
            self.layers = nn.CellList([Layer() for _ in range(m["num_layers"])])
            self.norm = RMSNorm()
            self.head = dense(h, v)

        def construct(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x)).reshape(-1, v)

    class LMLoss(nn.Cell):
        def construct(self, logits, labels):
            return ops.cross_entropy(logits, labels.reshape(-1))

    start = time.perf_counter()
    net = Llama()
    params = net.trainable_params()
    optimizer = nn.AdamWeightDecay([{"params": [q for q in params if q.ndim > 1], "weight_decay": optim["weight_decay"]},
                                    {"params": [q for q in params if q.ndim <= 1], "weight_decay": 0.0}],
                                   learning_rate=opts.lr, beta1=optim["beta1"], beta2=optim["beta2"], eps=optim["eps"])
    train_net = nn.TrainOneStepCell(nn.WithLossCell(net, LMLoss()), optimizer)
    train_net.set_train(True)
    total, mbs = opts.warmup + opts.iters, m["micro_batch_size"]
    end_times, losses = [], []
    for it in range(total):
        if it == 0:
            iter1_start = time.perf_counter()
        items = [dataset[i] for i in range(it * mbs, (it + 1) * mbs)]
        loss = train_net(Tensor(np.stack([x["tokens"] for x in items])), Tensor(np.stack([x["labels"] for x in items])))
        losses.append(float(loss.asnumpy()))
        end_times.append(time.perf_counter())
    return summarize("baseline", end_times, losses, start, end_times[0] - iter1_start, mbs * s,
                     opts.warmup, opts.iters)
