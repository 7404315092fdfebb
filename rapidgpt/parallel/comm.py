"""Every collective of RapidGPT lives here: process start-up, groups, and the collective cells.

Backends differ in what they offer. Ascend (HCCL) and GPU (NCCL) have every collective natively;
MindSpore's CPU backend (mccl) has AllReduce-SUM on any group and little else (no MAX, no
ReduceScatter, no Send/Receive in graphs, AllGather and Broadcast on the world group only; it
does have the PyNative isend/irecv that PairExchange uses). So each op below uses the native
primitive where the backend has it and otherwise an EXACT emulation on
AllReduce-SUM, in which every other rank contributes zeros (x + 0 == x bit for bit):

    all_gather(x)       place x in its slot of a zero buffer [n * d0, ...], AllReduce-SUM
    broadcast(x, src)   src contributes x, the others zeros, AllReduce-SUM
    reduce_scatter(x)   AllReduce-SUM, keep this rank's slice (same bytes moved twice: fine for
                        the small CPU jobs it serves)
    all_reduce MAX      all_gather, then max over the gathered copies (same result on every rank)
    point-to-point      a 2-rank group: the sender contributes x, the receiver zeros (used only
                        where MindSpore has no isend/irecv kernel: see PairExchange)

The collectives are `nn.Cell`s, built once per group, so they can be called inside `mindspore.jit`
graphs and custom-bprop cells; PairExchange is host-side only. Group of size 1: every op is the
identity (or a plain slice).
"""
import os

import mindspore as ms
from mindspore import nn, ops

from rapidgpt.errors import UserError
from rapidgpt.mindspore_private import isend_irecv
from rapidgpt.msrun_env import launched_by_msrun

_STATE = {"initialized": False, "native": False, "native_p2p": False, "groups": {}}


def serve_as_scheduler():
    """All the scheduler does: `init()` in that role registers the workers, serves them until every
    one has left, then ends the process (it does not return; it raises if the cluster fails)."""
    from mindspore.communication import init
    init()


def initialized():
    """Whether this process has joined msrun's job (its device is then set for good)."""
    return _STATE["initialized"]


# MindSpore's CPU collectives give up after this many seconds without the other ranks (its
# default 30 s, measured: an AllReduce whose peer arrived 40 s later failed at 30.0 s, and passed
# with the variable at 120; at 8 it failed at 8.0 s). Read by the CPU collective library.
CPU_TIMEOUT_VARIABLE = "MS_CPU_COMM_OP_TIMEOUT"


def set_collective_timeout(minutes):
    """Before init_distributed: the CPU collectives wait `minutes` (--distributed-timeout-minutes)
    for the other ranks, unless MS_CPU_COMM_OP_TIMEOUT is set already. A rank that reaches a
    collective while another still compiles its step (tens of seconds on a busy machine) waits
    instead of failing the job."""
    os.environ.setdefault(CPU_TIMEOUT_VARIABLE, str(max(1, round(minutes * 60))))


def init_distributed(device):
    """Join the job msrun started (`mindspore.communication.init()`), once; returns
    `(rank, world_size)`, `(0, 1)` outside msrun. `device` ("cpu", "gpu", "ascend") decides
    whether collectives are native or emulated."""
    _STATE["native"] = device != "cpu"
    _STATE["native_p2p"] = device in ("cpu", "ascend")          # see PairExchange
    if not launched_by_msrun():
        return 0, 1
    from mindspore.communication import get_group_size, get_rank, init
    if not _STATE["initialized"]:
        init()
        _STATE["initialized"] = True
    return get_rank(), get_group_size()


def _world_group():
    from mindspore.communication import GlobalComm
    return GlobalComm.WORLD_COMM_GROUP


def new_group(ranks, purpose=None):
    """The communication group of `ranks` (global ranks, in group-rank order) for this process,
    created on first use; every member must ask for it. None for a group of one. A `purpose`
    gives the same ranks a group of their own (messages on one group arrive in the order they
    were sent, whatever their tag: measured on the CPU backend)."""
    ranks = tuple(ranks)
    if len(ranks) == 1:
        return None
    key = ranks if purpose is None else (ranks, purpose)
    if key not in _STATE["groups"]:
        from mindspore.communication import create_group, get_group_size
        if purpose is None and len(ranks) == get_group_size() and ranks == tuple(range(len(ranks))):
            name = _world_group()
        else:
            name = "rapidgpt_" + "_".join(map(str, ranks)) + ("" if purpose is None else "_" + purpose)
            create_group(name, list(ranks))
        _STATE["groups"][key] = Group(name, ranks)
    return _STATE["groups"][key]


class Group:
    """A communication group: its backend name, its global ranks, and this process's place in it."""

    def __init__(self, name, ranks):
        from mindspore.communication import get_rank
        self.name, self.ranks, self.size = name, tuple(ranks), len(ranks)
        self.rank = self.ranks.index(get_rank())

    def __repr__(self):
        return f"Group({self.name}, ranks={list(self.ranks)})"


def group_size(group):
    return 1 if group is None else group.size


def group_rank(group):
    return 0 if group is None else group.rank


# ---- the collectives ----------------------------------------------------------------------------

class AllReduce(nn.Cell):
    """`x` -> elementwise sum (op="sum") or max (op="max") of `x` over the group."""

    def __init__(self, group, op="sum"):
        super().__init__()
        if op not in ("sum", "max"):
            raise ValueError(f"all-reduce op must be 'sum' or 'max', got {op!r}")
        self.size, self.op = group_size(group), op
        if self.size > 1:
            native = _STATE["native"] or op == "sum"
            reduce_op = ops.ReduceOp.SUM if op == "sum" else ops.ReduceOp.MAX
            self.reduce = ops.AllReduce(reduce_op, group.name) if native else None
            self.gather = None if native else AllGather(group, axis=0)

    def construct(self, x):
        if self.size == 1:
            return x
        if self.reduce is not None:
            return self.reduce(x)
        gathered = self.gather(ops.expand_dims(x, 0))              # [n, *x.shape]
        return gathered.max(axis=0)


class AllGather(nn.Cell):
    """`x` `[..., d, ...]` -> the group's `x`s concatenated along `axis` in group-rank order."""

    def __init__(self, group, axis=0):
        super().__init__()
        self.size, self.axis = group_size(group), axis
        if self.size > 1:
            self.rank = group.rank
            self.native = ops.AllGather(group.name) if _STATE["native"] else None
            self.sum = ops.AllReduce(ops.ReduceOp.SUM, group.name)

    def construct(self, x):
        if self.size == 1:
            return x
        axis = self.axis % x.ndim
        if self.native is not None:                                 # gathers along axis 0
            if axis == 0:
                return self.native(x)
            moved = self.native(ops.moveaxis(x, axis, 0))
            return ops.moveaxis(moved, 0, axis)
        pieces = [x if r == self.rank else ops.zeros_like(x) for r in range(self.size)]
        return self.sum(ops.cat(pieces, axis))


class ReduceScatter(nn.Cell):
    """`x` `[..., n*d, ...]` -> this rank's `d`-slice along `axis` of the group's elementwise sum."""

    def __init__(self, group, axis=0):
        super().__init__()
        self.size, self.axis = group_size(group), axis
        if self.size > 1:
            self.rank = group.rank
            native = _STATE["native"]
            self.native = ops.ReduceScatter(ops.ReduceOp.SUM, group.name) if native else None
            self.sum = None if native else ops.AllReduce(ops.ReduceOp.SUM, group.name)

    def construct(self, x):
        if self.size == 1:
            return x
        axis = self.axis % x.ndim
        if self.native is not None:                                 # scatters along axis 0
            if axis == 0:
                return self.native(x)
            return ops.moveaxis(self.native(ops.moveaxis(x, axis, 0)), 0, axis)
        return ops.chunk(self.sum(x), self.size, axis)[self.rank]


class Broadcast(nn.Cell):
    """`x` on group rank `src` -> every rank (the others' `x` give only shape and dtype)."""

    def __init__(self, group, src=0):
        super().__init__()
        self.size = group_size(group)
        if self.size > 1:
            self.is_src = group.rank == src
            self.native = ops.Broadcast(group.ranks[src], group.name) if _STATE["native"] else None
            self.sum = ops.AllReduce(ops.ReduceOp.SUM, group.name)

    def construct(self, x):
        if self.size == 1:
            return x
        if self.native is not None:
            return self.native((x,))[0]
        return self.sum(x if self.is_src else ops.zeros_like(x))


class PairExchange:
    """Point-to-point between the two ranks of a 2-rank group (neighbouring pipeline stages),
    called from the host between compiled pieces (PyNative), never inside a graph.

    `exchange(send=None, receive=None)`: send the tensor `send` to the other rank and/or receive
    one shaped and typed like the tensor `receive` (whose values are not used); returns the received
    tensor (or None). The two ranks must make matching calls in the same order: one's `send` is the
    other's `receive`, and when both send and receive, both do.

    Native (`native=True`, the default on Ascend and CPU): MindSpore's isend/irecv ops (those behind
    `mindspore.mint.distributed.isend/irecv`, which MindSpore 2.10 runs on HCCL and on the CPU
    backend; rapidgpt/mindspore_private.py). They are called as ops because `mint.distributed.isend` checks the destination against
    this process's rank in the group named "hccl_world_group" (bound when MindSpore is imported),
    which does not exist on CPU. The lower group rank sends first and the higher receives first, so
    two ranks that both send and receive never both wait in a send (on a device stream they would
    deadlock). Measured on CPU (2 processes, a [8, 128, 256] fp32 tensor each way): 8.1 ms, against
    21.9 ms for the all-reduce exchange.
    Otherwise (GPU: MindSpore 2.10 documents these ops for Ascend and CPU only) the exact
    all-reduce exchange: one direction, the sender contributes the tensor and the receiver zeros;
    both directions, a `[2, ...]` buffer in which each rank fills its own slot.
    """

    def __init__(self, group, native=None):
        if group_size(group) != 2:
            raise ValueError(f"a point-to-point exchange needs a group of two ranks, got {group}")
        self.group, self.me, self.peer = group.name, group.rank, 1 - group.rank
        self.native = _STATE["native_p2p"] if native is None else native
        self.sum = None if self.native else ops.AllReduce(ops.ReduceOp.SUM, group.name)

    def exchange(self, send=None, receive=None):
        if self.native:
            return self._native(send, receive)
        if send is not None and receive is not None:
            slots = [ops.zeros_like(receive), ops.zeros_like(receive)]
            slots[self.me] = send
            return self.sum(ops.stack(slots))[self.peer]
        if send is not None:
            self.sum(send)
            return None
        return self.sum(ops.zeros_like(receive))

    def _native(self, send, receive):
        isend, irecv = isend_irecv()
        buffer = None if receive is None else ops.zeros_like(receive)
        calls = []
        if send is not None:
            calls.append(lambda: isend(send, self.peer, self.group, 0))
        if buffer is not None:                     # received in place
            calls.append(lambda: irecv(buffer, 0, self.peer, self.group))
        if self.me == 1:
            calls.reverse()
        for handle in [call()[1] for call in calls]:
            handle.wait()
        return buffer


class InterleavedScheduleError(UserError, ValueError):
    pass


class AsyncPair:
    """Asynchronous point-to-point between the two ranks of a 2-rank group (the interleaved
    pipeline schedule's links, rapidgpt/parallel/pipeline.py RingLinks), host-side only.

    `send(x)` posts the send and returns at once (MindSpore's isend: measured on the CPU backend,
    a send completes without its receiver, and messages arrive in the order sent); `receive(like)`
    waits for the next message, shaped and typed like `like`; `finish()` waits for every posted
    send, whose tensors are kept until then. Needs MindSpore's isend/irecv (CPU and Ascend): a
    blocking emulation could deadlock on the schedule's ring.
    """

    def __init__(self, group):
        if group_size(group) != 2:
            raise ValueError(f"a point-to-point link needs a group of two ranks, got {group}")
        if not _STATE["native_p2p"]:
            raise InterleavedScheduleError("the interleaved pipeline schedule needs MindSpore's asynchronous isend/irecv, "
                             "which MindSpore 2.10 has on Ascend and CPU only; on GPU drop "
                             "--num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank")
        self.group, self.peer = group.name, 1 - group.rank
        self.pending = []

    def send(self, x):
        isend, _ = isend_irecv()
        self.pending.append((x, isend(x, self.peer, self.group, 0)[1]))

    def receive(self, like):
        _, irecv = isend_irecv()
        buffer = ops.zeros_like(like)
        irecv(buffer, 0, self.peer, self.group)[1].wait()
        return buffer

    def finish(self):
        for _, handle in self.pending:
            handle.wait()
        self.pending = []


def sum_over_ranks(number, group=None):
    """The sum of `number` (an int) over the ranks of `group` (default: the world), on every rank;
    it also waits until they all get here. Outside msrun: `number` itself."""
    if not _STATE["initialized"]:
        return number
    name = _world_group() if group is None else group.name
    total = ops.AllReduce(ops.ReduceOp.SUM, name)(ms.Tensor([number], ms.float32)).asnumpy()
    return int(round(float(total[0])))


def gather_over_ranks(values):
    """`[world size, len(values)]` float64 array of every rank's `values` (a list of floats), on
    every rank (row r: rank r's); outside msrun one row. Host-side, for timers and stop decisions."""
    import numpy as np
    values = np.asarray(values, np.float32)
    if not _STATE["initialized"]:
        return values[None].astype(np.float64)
    from mindspore.communication import get_group_size, get_rank
    rows = np.zeros((get_group_size(), len(values)), np.float32)
    rows[get_rank()] = values
    return ops.AllReduce(ops.ReduceOp.SUM, _world_group())(ms.Tensor(rows)).asnumpy().astype(np.float64)


def barrier(group=None):
    """Wait until every rank of `group` (default: the world) gets here."""
    sum_over_ranks(1, group)
