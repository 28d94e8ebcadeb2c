"""The Upload RPC's data chunks, encoded and decoded by hand, byte for byte as protobuf does.

An upload moves GiBs in 1 MiB ``UploadChunk(offset, data)`` messages. Building and
serializing one with the generated code copies its data twice, and parsing copies it once
more; these functions copy it once to send and not at all to receive. The agent encodes,
the coordinator decodes, and this module is the one place both take the wire from.
Anything but a plain data chunk (the header message, malformed input) goes through protobuf.
"""

from __future__ import annotations

from typing import NamedTuple

from rankscope.proto.v1 import rankscope_pb2 as pb

UPLOAD_METHOD = "/rankscope.v1.AgentService/Upload"
# The coordinator keeps an upload in progress as "<upload_id>.part" and ".json": with the
# temporary name a header is written under, that stays within a file name's 255 bytes.
MAX_UPLOAD_ID = 200
_OFFSET_TAG = b"\x10"  # UploadChunk.offset: field 2, varint
_DATA_TAG = b"\x1a"  # UploadChunk.data: field 3, length-delimited
_MAX_VARINT = 10  # bytes of a 64-bit varint


class DataChunk(NamedTuple):
    """An UploadChunk without a header, its data a view into the received message."""

    offset: int
    data: memoryview


def encode(offset: int, data: bytes) -> bytes:
    """``UploadChunk(offset=offset, data=data).SerializeToString()`` in one copy of ``data``."""
    head = _OFFSET_TAG + _encode_varint(offset) if offset else b""
    return b"".join((head, _DATA_TAG, _encode_varint(len(data)), data)) if data else head


def decode(raw: bytes) -> pb.UploadChunk | DataChunk:
    """The Upload RPC's request deserializer: a data chunk as agents send it (offset then
    data, nothing else) becomes a DataChunk viewing ``raw``; anything else an UploadChunk."""
    pos, offset = 0, 0
    if raw[:1] == _OFFSET_TAG:
        offset, pos = _decode_varint(raw, 1)
    if offset >= 0 and raw[pos : pos + 1] == _DATA_TAG:
        length, start = _decode_varint(raw, pos + 1)
        if length >= 0 and start + length == len(raw):
            return DataChunk(offset - (1 << 64) if offset >= 1 << 63 else offset, memoryview(raw)[start:])
    return pb.UploadChunk.FromString(raw)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; (-1, pos) where there is none."""
    value = shift = 0
    for end in range(pos, min(pos + _MAX_VARINT, len(raw))):
        byte = raw[end]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, end + 1
        shift += 7
    return -1, pos
