"""Data parallelism: averaging gradients over the data-parallel ranks in a few flat buffers.

Each DP rank computes the gradients of its own slice of the global batch, from its loss already
divided by the DP size (as Megatron's DDP scales gradients by 1/DP before reducing them: the sum is
then the mean, and in fp16 no partial sum grows beyond one rank's gradient, so an overflow happens
at the same loss scale as in one process); after the step's micro-batches are accumulated,
`GradientSummer` adds them over the DP ranks, so every rank holds the mean, applies the same update
and the replicas stay identical (they start identical: the
initialisation is seeded by parameter name). Why flat buffers: a collective costs a fixed latency
on top of its bytes (several ms on the CPU backend), so one call per parameter would cost more than
the model; gradients are concatenated into buckets of up to `bucket_elements` (per dtype, in
parameter order), each reduced with one all-reduce and split back.
"""
from mindspore import nn, ops

from rapidgpt.parallel import comm

DEFAULT_BUCKET_ELEMENTS = 1 << 25          # 32M elements (128 MB of fp32) per all-reduce


def plan_buckets(params, bucket_elements=DEFAULT_BUCKET_ELEMENTS):
    """Group parameter indices into buckets: same dtype, consecutive, at most `bucket_elements`
    elements each (a larger parameter gets a bucket of its own)."""
    buckets, current, size, dtype = [], [], 0, None
    for i, p in enumerate(params):
        n = int(p.size)
        if current and (p.dtype != dtype or size + n > bucket_elements):
            buckets.append(tuple(current))
            current, size = [], 0
        current.append(i)
        size, dtype = size + n, p.dtype
    if current:
        buckets.append(tuple(current))
    return tuple(buckets)


class GradientSummer(nn.Cell):
    """`grads` (tuple, in `params` order) -> their sum over the data-parallel group."""

    def __init__(self, params, group, bucket_elements=DEFAULT_BUCKET_ELEMENTS):
        super().__init__()
        self.size = comm.group_size(group)
        self.shapes = tuple(tuple(p.shape) for p in params)
        self.counts = tuple(int(p.size) for p in params)
        self.buckets = plan_buckets(params, bucket_elements)
        self.all_reduce = comm.AllReduce(group)

    def construct(self, grads):
        if self.size == 1:
            return grads
        averaged = []                       # buckets hold consecutive indices: params order
        for bucket in self.buckets:
            flat = self.all_reduce(ops.cat([grads[i].reshape(-1) for i in bucket]))
            start = 0
            for i in bucket:
                averaged.append(flat[start:start + self.counts[i]].reshape(self.shapes[i]))
                start += self.counts[i]
        return tuple(averaged)
