"""The PyTorch eager side of benchmarks/bench_pretrain.py: the bench's GPT written as a PyTorch user
writes it (nanoGPT's shape), started from RapidGPT's initial weights, trained on the same data with
the same optimizer semantics.

- Model: RapidGPT's GPT (rapidgpt/models/gpt.py) op for op: learned token and position
  embeddings, pre-LayerNorm layers, QKV laid out per head `[np, 3, hn]` as Megatron's, causal
  softmax attention, tanh-GELU MLP, final LayerNorm, logits tied to the word embeddings, mean
  token cross-entropy. Attention is `F.scaled_dot_product_attention` (what a PyTorch user calls;
  its masked scores are -inf where RapidGPT fills -10000, which softmax makes 0 either way).
- Weights: RapidGPT's seeded initial weights, written by `write_initial_weights` to an .npz under
  RapidGPT's parameter names and loaded here (so the first loss is RapidGPT's first loss).
- Optimizer: torch.optim.AdamW over Megatron's groups (no decay for biases and 1-D parameters),
  clipped by the global norm (`clip_grad_norm_`, RapidGPT's --clip-grad), constant learning rate.
- Dropout: PyTorch's own generator (the masks differ from RapidGPT's; their number does not).

torch is an optional benchmark extra (`pip install torch==2.13.0`), never a RapidGPT dependency;
this module imports it only inside `run_torch`.
"""
import time

import numpy as np


def write_initial_weights(path, argv):
    """RapidGPT's initial weights of the bench GPT (`argv`: the engine's flags) into `path` (.npz,
    RapidGPT's parameter names), as the engine draws them (rapidgpt/parallel/random.py)."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.parallel.random import initialize_parameters

    args = parse_args(argv=[str(a) for a in argv])
    gpt = build_gpt_model(args, args.vocab_size)
    initialize_parameters(gpt, args.seed)
    np.savez(path, **{p.name: p.asnumpy() for p in gpt.trainable_params()})


def run_torch(opts, model, optim, weights_path, dataset, summarize):
    """PyTorch eager training of `model` (a bench_pretrain MODELS entry) from the weights in
    `weights_path`, on `dataset`; `summarize`: bench_pretrain's result maker."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(opts.threads)
    torch.manual_seed(1234)
    m = model
    h, heads, s, v = m["hidden_size"], m["num_heads"], m["seq_length"], m["vocab_size"]
    p = m["dropout"]
    eps = m["layernorm_eps"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query_key_value = nn.Linear(h, 3 * h)
            self.dense = nn.Linear(h, h)

        def forward(self, x):
            b = x.shape[0]
            qkv = self.query_key_value(x).view(b, s, heads, 3, h // heads)     # Megatron's [np, 3, hn]
            q, k, val = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))    # [b, np, s, hn]
            context = F.scaled_dot_product_attention(q, k, val, dropout_p=p if self.training else 0.0,
                                                     is_causal=True)
            return self.dense(context.transpose(1, 2).reshape(b, s, h))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.LayerNorm(h, eps=eps)
            self.self_attention = Attention()
            self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
            self.dense_h_to_4h = nn.Linear(h, 4 * h)
            self.dense_4h_to_h = nn.Linear(4 * h, h)
            self.dropout = nn.Dropout(p)

        def forward(self, x):
            x = x + self.dropout(self.self_attention(self.input_layernorm(x)))
            mlp = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x)), approximate="tanh"))
            return x + self.dropout(mlp)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Embedding(v, h)
            self.position_embeddings = nn.Embedding(s, h)
            self.dropout = nn.Dropout(p)
            self.layers = nn.ModuleList(Layer() for _ in range(m["num_layers"]))
            self.final_layernorm = nn.LayerNorm(h, eps=eps)
            self.register_buffer("positions", torch.arange(s), persistent=False)

        def forward(self, tokens, labels):
            x = self.dropout(self.word_embeddings(tokens) + self.position_embeddings(self.positions))
            for layer in self.layers:
                x = layer(x)
            logits = self.final_layernorm(x) @ self.word_embeddings.weight.t()        # tied
            return F.cross_entropy(logits.view(-1, v), labels.reshape(-1))

    start = time.perf_counter()
    net = GPT()
    load_rapidgpt_weights(net, np.load(weights_path))
    return train_eager(net, opts, m, optim, dataset, summarize, start)


def train_eager(net, opts, m, optim, dataset, summarize, start):
    """Train the torch module `net` (`net(tokens, labels)` -> mean loss) on `dataset` as the
    bench does: torch.optim.AdamW over Megatron's groups (no decay for biases and 1-D parameters),
    clipped by the global norm (`clip_grad_norm_`, RapidGPT's --clip-grad), constant rate;
    `start`: when building the model began."""
    import torch
    net.train()
    params = list(net.parameters())
    decay = [q for q in params if q.ndim > 1]                      # Megatron's groups: 1-D params and
    no_decay = [q for q in params if q.ndim <= 1]                  # biases are not decayed
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": optim["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=opts.lr,
                                  betas=(optim["beta1"], optim["beta2"]), eps=optim["eps"])
    total, mbs = opts.warmup + opts.iters, m["micro_batch_size"]
    end_times, losses = [], []
    for it in range(total):
        if it == 0:
            iter1_start = time.perf_counter()
        items = [dataset[i] for i in range(it * mbs, (it + 1) * mbs)]
        tokens = torch.from_numpy(np.stack([x["tokens"] for x in items]).astype(np.int64))
        labels = torch.from_numpy(np.stack([x["labels"] for x in items]).astype(np.int64))
        loss = net(tokens, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if opts.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(params, opts.clip_grad)
        optimizer.step()
        losses.append(loss.item())
        end_times.append(time.perf_counter())
    return summarize("pytorch", end_times, losses, start, end_times[0] - iter1_start, mbs * m["seq_length"],
                     opts.warmup, opts.iters, {"torch_version": torch.__version__})


# RapidGPT's names -> this module's (LayerNorm gamma/beta are PyTorch's weight/bias; the MLP's
# linears sit directly in the layer here).
_RENAMES = ((".gamma", ".weight"), (".beta", ".bias"), (".mlp.", "."))


def load_rapidgpt_weights(net, weights):
    import torch
    state = net.state_dict()
    loaded = {}
    for name, value in weights.items():
        ours = name
        for old, new in _RENAMES:
            ours = ours.replace(old, new)
        if ours not in state or tuple(state[ours].shape) != value.shape:
            raise SystemExit(f"torch side: RapidGPT's {name} {value.shape} has no counterpart")
        loaded[ours] = torch.from_numpy(np.ascontiguousarray(value))
    missing = sorted(set(state) - set(loaded))
    if missing:
        raise SystemExit(f"torch side: no RapidGPT weights for {missing}")
    net.load_state_dict(loaded)
