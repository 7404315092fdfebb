"""TensorBoard scalars read back from a --tensorboard-dir, for comparisons more precise than the
log's (Megatron's log line prints the grad norm with 3 decimals; the scalar holds the float32
value).

An event file is a sequence of records (TFRecord framing: an 8-byte little-endian length, a
4-byte checksum of it, the serialized `Event` protobuf, a 4-byte checksum of the data); the
`Event` message is tensorboardX's own (tensorboardX.proto.event_pb2).
"""
import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event


def _events(path):
    data = Path(path).read_bytes()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        start = at + 12
        event = Event()
        event.ParseFromString(data[start:start + length])
        yield event
        at = start + length + 4


def all_scalars(folder):
    """{tag: {step: value}} of every scalar over every event file under `folder` (a resumed run
    adds a file; a later file's value for a step wins, as TensorBoard shows it)."""
    found = {}
    for path in sorted(Path(folder).rglob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        for event in _events(path):
            for value in event.summary.value:
                found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


def scalars(folder, tag):
    """{step: value} of scalar `tag` (see all_scalars)."""
    return all_scalars(folder).get(tag, {})
