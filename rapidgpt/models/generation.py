"""Text generation from a GPT: greedy, or sampling with temperature / top-k / top-p.

With the key/value cache (default) the prompt is run once and every new token costs one
single-position step (`GPTModel.decode`); without it each step re-runs the whole sequence, which
gives the same tokens and serves as the reference. The sequence is capped at the model's
`max_position_embeddings`: the prompt keeps its last tokens, generation stops at the cap or at EOD.
"""
import numpy as np
from mindspore import Tensor


def choose_token(logits, rng, top_k=0, top_p=0.0, temperature=1.0):
    """Next token from `logits` [vocab]: argmax when top_k and top_p are 0, else a sample."""
    if not top_k and not top_p:
        return int(np.argmax(logits))
    logits = logits.astype(np.float64) / temperature
    order = np.argsort(-logits)
    if top_k:
        order = order[:top_k]
    probs = np.exp(logits[order] - logits[order[0]])
    probs /= probs.sum()
    if top_p:
        # Nucleus: the smallest set of likeliest tokens whose probability reaches top_p.
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(len(order), p=probs)])


def generate(model, tokenizer, prompt, max_new_tokens, top_k=0, top_p=0.0, temperature=1.0, seed=0,
             use_cache=True):
    """Continuation of `prompt` (text), at most `max_new_tokens` tokens."""
    window = model.config.max_position_embeddings
    ids = (tokenizer.tokenize(prompt) or [tokenizer.eod])[-(window - 1):]
    new = generate_ids(model, ids, max_new_tokens, [[tokenizer.eod]], top_k, top_p, temperature, seed, use_cache)
    return tokenizer.detokenize(new)


def generate_ids(model, ids, max_new_tokens, stop=(), top_k=0, top_p=0.0, temperature=1.0, seed=0,
                 use_cache=True):
    """The token ids continuing `ids` (a list of ints): at most `max_new_tokens`, fewer when they end
    with one of the id sequences `stop` (e.g. [[eod]]; the sequence is not returned) or at the
    model's last position."""
    rng = np.random.default_rng(seed)
    window = model.config.max_position_embeddings
    ids = list(ids)
    was_training = model.training
    model.set_train(False)
    new, past, pending = [], None, ids
    try:
        while len(new) < max_new_tokens and len(ids) < window:
            if use_cache:
                start = len(ids) - len(pending)
                positions = np.arange(start, len(ids), dtype=np.int32)[None]
                logits, past = model.decode(Tensor(np.array(pending, np.int32)[None]), Tensor(positions), past)
            else:
                positions = np.arange(len(ids), dtype=np.int32)[None]
                logits = model(Tensor(np.array(ids, np.int32)[None]), Tensor(positions))
            token = choose_token(logits.asnumpy()[0, -1], rng, top_k, top_p, temperature)
            ids.append(token)
            new.append(token)
            pending = [token]
            ended = next((seq for seq in stop if seq and new[-len(seq):] == list(seq)), None)
            if ended is not None:
                del new[-len(ended):]
                break
    finally:
        model.set_train(was_training)
    return new
