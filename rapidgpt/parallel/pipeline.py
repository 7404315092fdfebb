"""Pipeline parallelism: the order of Megatron's 1F1B schedule and of its interleaved form, the
point-to-point exchanges between stages, and a rank's model chunks under the interleaved schedule
(run by rapidgpt/training/pipeline_schedules.py). Which layers a stage (or chunk) holds is
rapidgpt/config/pipeline_split.py's PipelineSplit.

Point-to-point: neighbours s and s+1 share a 2-rank group and exchange through
`comm.PairExchange` (MindSpore's isend/irecv on CPU and Ascend, an exact all-reduce exchange
elsewhere). The combined exchanges (send forward + receive backward, and the reverse) move both
directions at once, so two neighbours never both wait to send; each link's call sequences on its
two ends match exactly (`one_f_one_b`; tests/test_pipeline.py checks it).
"""
from mindspore import nn, ops

from rapidgpt.parallel import comm


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


def interleaved_one_f_one_b(pp_size, stage, virtual_size, num_micro_batches, group_size):
    """Megatron's interleaved 1F1B for `stage` with `virtual_size` V model chunks per rank: a list
    of actions `(kind, (chunk, micro-batch))`, kinds as one_f_one_b's without the combined ones.

    Virtual stage (stage p, chunk v) is the (v * P + p)-th of the model: its input comes from
    (p - 1, v), or (P - 1, v - 1) for p = 0, its output goes to (p + 1, v), or (0, v + 1) from the
    last rank. Megatron's order (get_schedule_table, get_pp_rank_microbatches): the k-th forward
    runs the k-th entry of the table that walks the micro-batches in groups of `group_size`, each
    group through chunk 0, then chunk 1, ...; the k-th backward the same entry with the chunks
    reversed. Warm-up: min(2 (P - p - 1) + (V - 1) group_size, m V) forwards; then one forward,
    one backward; then the remaining backwards. A receive comes right before the computation that
    needs it and a send right after the one that produced it (asynchronous sends: RingLinks), so
    each link carries its messages in the order the receiving side asks for them
    (tests/test_pipeline.py simulates every stage).
    """
    p, v_size, m = stage, virtual_size, num_micro_batches
    table = []
    for start in range(0, m, group_size):
        stop = m if start + group_size >= m else start + group_size
        table += [(chunk, i) for chunk in range(v_size) for i in range(start, stop)]
    total = len(table)
    warmup = min(2 * (pp_size - p - 1) + (v_size - 1) * group_size, total)
    actions = []

    def first(chunk):                   # the model's first virtual stage: no input to receive
        return p == 0 and chunk == 0

    def last(chunk):                    # its last: the loss, no output to send
        return p == pp_size - 1 and chunk == v_size - 1

    def forward(k):
        chunk, i = table[k]
        if not first(chunk):
            actions.append(("recv_forward", (chunk, i)))
        actions.append(("forward", (chunk, i)))
        if not last(chunk):
            actions.append(("send_forward", (chunk, i)))

    def backward(k):
        chunk, i = table[k]
        chunk = v_size - 1 - chunk
        if not last(chunk):
            actions.append(("recv_backward", (chunk, i)))
        actions.append(("backward", (chunk, i)))
        if not first(chunk):
            actions.append(("send_backward", (chunk, i)))

    for k in range(warmup):
        forward(k)
    for k in range(total - warmup):
        forward(warmup + k)
        backward(k)
    for k in range(total - warmup, total):
        backward(k)
    return actions


def interleaved_forward_only(pp_size, stage, virtual_size):
    """The evaluation order of one micro-batch through this rank's chunks (see above)."""
    actions = []
    for chunk in range(virtual_size):
        if stage > 0 or chunk > 0:
            actions.append(("recv_forward", (chunk, 0)))
        actions.append(("forward", (chunk, 0)))
        if stage < pp_size - 1 or chunk < virtual_size - 1:
            actions.append(("send_forward", (chunk, 0)))
    return actions


class ModelChunks(nn.Cell):
    """A rank's model chunks under the interleaved schedule (Megatron's list of modules, one per
    virtual stage), as one model to the engine. Its cells, parameters and their names are the
    chunks' own, unprefixed: the chunks are pieces of one model whose layers keep their global
    names and no two of which hold the same parameter, so seeded initialisation, dropout streams,
    checkpoints and every model transform see the names they see without chunks. A call (and
    `set_input_tensor`) goes to the chunk `select`ed by the schedule, so a forward hook written
    for one model runs each chunk."""

    def __init__(self, chunks):
        super().__init__(auto_prefix=False)
        self.chunks = nn.CellList(chunks, auto_prefix=False)
        self.current = 0
        for name in ("vocab_size", "padded_vocab_size", "config"):
            if hasattr(chunks[0], name):
                setattr(self, name, getattr(chunks[0], name))

    def __len__(self):
        return len(self.chunks)

    def select(self, chunk):
        self.current = chunk

    def cells_and_names(self, cells=None, name_prefix=""):
        seen = cells if cells else set()
        if self in seen:
            return
        seen.add(self)
        yield name_prefix, self
        for chunk in self.chunks:
            yield from chunk.cells_and_names(seen, name_prefix)

    def set_input_tensor(self, input_tensor):
        self.chunks[self.current].set_input_tensor(input_tensor)

    def construct(self, *args, **kwargs):
        return self.chunks[self.current](*args, **kwargs)


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

    def finish(self):
        """Nothing: each exchange has completed when it returns."""


class RingLinks:
    """This rank's exchanges under the interleaved schedule, on a ring: the previous stage (the
    last one for stage 0) and the next (the first one for the last stage), each a 2-rank group
    (`prev_group`, `next_group`; with P = 2 the two are different groups of the same two ranks, so
    each direction of each group carries one kind of message). Sends are asynchronous (`comm.
    AsyncPair`): a stage sends as soon as it has computed and receives when it needs, in the
    order both sides walk the schedule table (interleaved_one_f_one_b)."""

    def __init__(self, prev_group, next_group, shape, dtype):
        self.like = ops.zeros(tuple(shape), dtype)
        self.prev, self.next = comm.AsyncPair(prev_group), comm.AsyncPair(next_group)

    def recv_forward(self):
        return self.prev.receive(self.like)

    def send_forward(self, output):
        self.next.send(output)

    def recv_backward(self):
        return self.next.receive(self.like)

    def send_backward(self, input_grad):
        self.prev.send(input_grad)

    def finish(self):
        """Wait until every send of the step has left (their tensors are held until then)."""
        self.prev.finish()
        self.next.finish()
