"""Run by msrun with 4 ranks (tests/test_parallel.py): every collective of rapidgpt.parallel.comm on
the world group and on sub-groups, eager and compiled, and the point-to-point exchange on the
2-rank groups, against numpy. Prints "comm ok" on success."""
import numpy as np
import mindspore as ms

from rapidgpt.parallel import comm

rank, world = comm.init_distributed("cpu")
ms.set_context(mode=ms.PYNATIVE_MODE)
assert world == 4, world


def value(r, shape=(2, 3)):
    """The tensor rank r contributes: distinct per rank, with negatives (for max)."""
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 2.5) * (r + 1) * (-1) ** r


def run(cell, x, jit):
    call = ms.jit(cell.construct) if jit else cell
    return call(ms.Tensor(x)).asnumpy()


def check_pair_exchange(group, me, ranks):
    """Native isend/irecv and the all-reduce exchange: one way in each direction, then both ways,
    in fp32, fp16 and bf16 (not the all-reduce exchange: the CPU AllReduce kernel has no bf16); what
    arrives is exactly what the other rank sent."""
    peer = ranks[1 - me]
    for native in (True, False):
        link = comm.PairExchange(group, native=native)
        for dtype in (ms.float32, ms.float16) + ((ms.bfloat16,) if native else ()):
            where = f"pair {ranks}, native={native}, {dtype}"
            sent, expected = ms.Tensor(value(rank), dtype), ms.Tensor(value(peer), dtype)
            like = ms.ops.zeros((2, 3), dtype)
            for sender in (0, 1):
                got = link.exchange(send=sent) if me == sender else link.exchange(receive=like)
                if me != sender:
                    assert got.dtype == dtype, where
                    np.testing.assert_array_equal(got.float().asnumpy(), expected.float().asnumpy(), where)
            got = link.exchange(send=sent, receive=like)
            np.testing.assert_array_equal(got.float().asnumpy(), expected.float().asnumpy(), where)


groups = [(0, 1, 2, 3), (0, 2) if rank % 2 == 0 else (1, 3), (0, 1) if rank < 2 else (2, 3)]
for ranks in groups:
    group = comm.new_group(ranks)
    me = ranks.index(rank)
    mine = value(rank)
    everyone = [value(r) for r in ranks]
    for jit in (False, True):
        where = f"group {ranks}, jit={jit}"
        np.testing.assert_array_equal(run(comm.AllReduce(group), mine, jit), sum(everyone), where)
        np.testing.assert_array_equal(run(comm.AllReduce(group, "max"), mine, jit),
                                      np.max(everyone, axis=0), where)
        for axis in (0, 1, -1):
            np.testing.assert_array_equal(run(comm.AllGather(group, axis), mine, jit),
                                          np.concatenate(everyone, axis), f"{where}, axis {axis}")
        wide = np.concatenate([value(rank, (2, 3))] * len(ranks), axis=1)      # [2, 3n]
        total = sum(np.concatenate([value(r, (2, 3))] * len(ranks), axis=1) for r in ranks)
        np.testing.assert_array_equal(run(comm.ReduceScatter(group, axis=1), wide, jit),
                                      np.split(total, len(ranks), axis=1)[me], where)
        for src in range(len(ranks)):
            np.testing.assert_array_equal(run(comm.Broadcast(group, src), mine, jit), everyone[src], where)
    if len(ranks) == 2:
        check_pair_exchange(group, me, ranks)
comm.barrier()
print(f"rank {rank}: comm ok", flush=True)
