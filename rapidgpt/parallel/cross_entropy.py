"""Cross entropy over vocabulary-parallel logits, without gathering the full logits.

Rank r holds logits `[N, V/tp]` for vocabulary ids `[r*V/tp, (r+1)*V/tp)`; labels `[N]` are
global ids. Per token:

    m      = max over ALL ranks' logits            (all-reduce MAX of the local maxima)
    sum_e  = sum over all ranks of sum exp(l - m)  (all-reduce SUM, [N])
    target = the label's logit - m, from the rank that holds it (all-reduce SUM of a masked pick)
    loss   = log(sum_e) - target

Backward: d loss / d l = softmax(l) - onehot(label) on each rank's slice, scaled by the incoming
gradient (Megatron's rule), obtained by differentiating the above with the two sums taken through
ReduceFromTensorParallelRegion (all-reduce forward, identity backward: the loss is replicated, so
each rank's slice gets the gradient of its own terms) and the maximum held constant (the loss does
not depend on it). No exchange in the backward. It is written without a custom bprop of its own
because MindSpore 2.10 fails to compile one inside a pipeline stage's recorded forward
("func_graph->get_return() is null"); the boundary cells compile there.
Columns at or past `vocab_size` (vocabulary padding) are masked out of the softmax.
"""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from rapidgpt.parallel import comm
from rapidgpt.parallel.mappings import ReduceFromTensorParallelRegion
from rapidgpt.parallel.state import get_tensor_model_parallel_group

_MASKED = -1.0e30          # exp(_MASKED - m) == 0 exactly, and no inf - inf


def cross_entropy(logits, labels):
    """`(logits [N, V] fp32, labels [N] in [0, V)) -> per-token loss [N]`: the single-rank case of
    the rule above (the maximum held constant; no ignore index: mask losses with a loss mask). Not ops.cross_entropy: its log-softmax differentiates
    through the row maximum (a ReduceMax gradient over [N, V]), ~3x slower on the CPU backend
    (measured on the bench model's [1024, 8000] logits)."""
    shifted = logits - ops.stop_gradient(logits.max(axis=-1, keepdims=True))
    picked = ops.gather_elements(shifted, 1, labels.reshape(-1, 1)).reshape(-1)
    return ops.log(ops.exp(shifted).sum(axis=-1)) - picked


class VocabParallelCrossEntropy(nn.Cell):
    """`(logits [N, V_local], labels [N]) -> per-token loss [N]` (fp32)."""

    def __init__(self, vocab_start, local_vocab, vocab_size, group=None):
        """This rank holds ids `[vocab_start, vocab_start + local_vocab)`; ids >= `vocab_size`
        are padding."""
        super().__init__()
        group = get_tensor_model_parallel_group() if group is None else group
        self.vocab_start = vocab_start
        self.padding = Tensor(np.arange(vocab_start, vocab_start + local_vocab) >= vocab_size)   # [V_local]
        self.all_reduce_max = comm.AllReduce(group, "max")
        # One boundary cell per call: MindSpore 2.10 mixes up the backwards of one custom-bprop
        # cell called twice in a graph differentiated by a pipeline stage (infinite gradients).
        self.sum_targets = ReduceFromTensorParallelRegion(group)
        self.sum_exps = ReduceFromTensorParallelRegion(group)

    def construct(self, logits, labels):
        logits = ops.masked_fill(logits.astype(ms.float32), self.padding, _MASKED)       # [N, V_local]
        row_max = ops.stop_gradient(self.all_reduce_max(logits.max(axis=-1, keepdims=True)))
        shifted = logits - row_max
        local = labels - self.vocab_start
        mine = ops.logical_and(local >= 0, local < logits.shape[-1])    # the label is in this slice
        picked = ops.gather_elements(shifted, 1, ops.where(mine, local, 0).reshape(-1, 1)).reshape(-1)
        target = self.sum_targets(picked * mine.astype(ms.float32))
        sum_exp = self.sum_exps(ops.exp(shifted).sum(axis=-1))
        return ops.log(sum_exp) - target
