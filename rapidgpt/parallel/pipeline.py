"""Pipeline parallelism: which layers a stage holds, the point-to-point exchanges between
neighbouring stages, and the order of Megatron's 1F1B schedule (run by
rapidgpt/training/pipeline_schedules.py).

Stage layout: the decoder's `num_layers` are split evenly, stage p holding global layers
`[p * L/P, (p + 1) * L/P)`; each keeps its global name (`layers.5....`), so seeded initialisation,
dropout masks and checkpoints do not depend on P.

Point-to-point: neighbours s and s+1 share a 2-rank group and exchange through
`comm.PairExchange` (MindSpore's isend/irecv on CPU and Ascend, an exact all-reduce exchange
elsewhere). The combined exchanges (send forward + receive backward, and the reverse) move both
directions at once, so two neighbours never both wait to send; each link's call sequences on its
two ends match exactly (`one_f_one_b`; tests/test_pipeline.py checks it).
"""
from mindspore import ops

from rapidgpt.parallel import comm


def stage_layer_range(num_layers, pp_size, pp_rank):
    """The global indices of the decoder layers stage `pp_rank` of `pp_size` holds."""
    if pp_size < 1 or num_layers % pp_size:
        raise ValueError(f"--num-layers {num_layers} is not divisible by --pipeline-model-parallel-size "
                         f"{pp_size}; choose a stage count that divides the layers")
    per_stage = num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


# ---- the schedule's order ------------------------------------------------------------------------

def one_f_one_b(pp_size, stage, num_micro_batches):
    """Megatron's non-interleaved 1F1B for `stage`: a list of actions, each
    `(kind, micro-batch)` with kind one of

        "recv_forward"   receive micro-batch i's input from the previous stage
        "forward"        run micro-batch i's forward (keep what its backward needs)
        "send_forward"   send its output to the next stage
        "send_forward_recv_backward"   send output i, receive the gradient of output j
        "recv_backward"  receive the gradient of micro-batch i's output
        "backward"       run micro-batch i's backward (free what its forward kept)
        "send_backward"  send the gradient of its input to the previous stage
        "send_backward_recv_forward"   send input gradient i, receive the input of micro-batch j

    (for the combined kinds the micro-batch is a pair (sent, received)). Warm-up: min(P - stage - 1,
    m) forwards; steady: one forward, one backward; cool-down: the remaining backwards. Actions that
    would talk to a stage that does not exist (before the first, after the last) are left out.
    """
    first, last = stage == 0, stage == pp_size - 1
    m = num_micro_batches
    warmup = min(pp_size - stage - 1, m)
    steady = m - warmup
    actions = []

    def add(kind, index, needed=True):
        if needed:
            actions.append((kind, index))

    for i in range(warmup):
        add("recv_forward", i, not first)
        add("forward", i)
        add("send_forward", i, not last)
    if steady:
        add("recv_forward", warmup, not first)
    for k in range(steady):
        i, j = warmup + k, k            # forward i, then backward j
        add("forward", i)
        add("send_forward_recv_backward", (i, j), not last)
        add("backward", j)
        if k == steady - 1:
            add("send_backward", j, not first)
        else:
            add("send_backward_recv_forward", (j, i + 1), not first)
    for j in range(steady, m):
        add("recv_backward", j, not last)
        add("backward", j)
        add("send_backward", j, not first)
    return actions


def forward_only(pp_size, stage, num_micro_batches):
    """The evaluation schedule: each micro-batch received, computed and sent on, in order."""
    actions = []
    for i in range(num_micro_batches):
        if stage > 0:
            actions.append(("recv_forward", i))
        actions.append(("forward", i))
        if stage < pp_size - 1:
            actions.append(("send_forward", i))
    return actions


# ---- point-to-point --------------------------------------------------------------------------------

class StageLinks:
    """This stage's exchanges with its neighbours: `prev_group` is (stage - 1, stage), `next_group`
    (stage, stage + 1), each None at the pipeline's ends; `shape`/`dtype`: the activations'
    (the gradients of the activations have the same)."""

    def __init__(self, prev_group, next_group, shape, dtype):
        self.like = ops.zeros(tuple(shape), dtype)
        self.prev = comm.PairExchange(prev_group) if prev_group is not None else None
        self.next = comm.PairExchange(next_group) if next_group is not None else None

    def recv_forward(self):
        return self.prev.exchange(receive=self.like)

    def send_forward(self, output):
        self.next.exchange(send=output)

    def recv_backward(self):
        return self.next.exchange(receive=self.like)

    def send_backward(self, input_grad):
        self.prev.exchange(send=input_grad)

    def send_forward_recv_backward(self, output):
        return self.next.exchange(send=output, receive=self.like)

    def send_backward_recv_forward(self, input_grad):
        return self.prev.exchange(send=input_grad, receive=self.like)
