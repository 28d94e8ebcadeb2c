"""The Upload RPC's hand-made chunk codec agrees with protobuf, byte for byte, both ways."""

from __future__ import annotations

import os

import pytest
from google.protobuf.message import DecodeError

from rankscope.proto.v1 import chunks
from rankscope.proto.v1 import rankscope_pb2 as pb


@pytest.mark.parametrize("offset", [0, 1, 127, 128, 300, 5 << 20, (1 << 40) + 5])
@pytest.mark.parametrize("size", [0, 1, 127, 128, 65536])
def test_chunks_are_encoded_as_protobuf_encodes_them(offset: int, size: int) -> None:
    data = os.urandom(size)
    assert chunks.encode(offset, data) == pb.UploadChunk(offset=offset, data=data).SerializeToString()


@pytest.mark.parametrize("message", [
    pb.UploadChunk(offset=0, data=b"x" * 300),
    pb.UploadChunk(offset=5 << 20, data=os.urandom(1 << 16)),
    pb.UploadChunk(offset=(1 << 40) + 1, data=b"a"),
    pb.UploadChunk(offset=-1, data=b"negative offsets parse as protobuf parses them"),
    pb.UploadChunk(offset=7),
    pb.UploadChunk(),
    pb.UploadChunk(header=pb.UploadHeader(upload_id="u1", size=3), offset=0, data=b"abc"),
])
def test_chunks_decode_as_protobuf_decodes_them(message: pb.UploadChunk) -> None:
    raw = message.SerializeToString()
    decoded = chunks.decode(raw)
    assert decoded.offset == message.offset and bytes(decoded.data) == message.data
    if message.HasField("header") or not message.data:
        assert decoded == message  # everything but a plain data chunk goes to protobuf
    else:
        assert isinstance(decoded, chunks.DataChunk) and decoded.data.obj is raw  # a view, not a copy


@pytest.mark.parametrize("raw", [
    b"\x1a\x05abc",  # data shorter than its length
    b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x1a\x01a",  # an 11-byte varint
    b"\x1a\x01ab",  # bytes after the data
    b"\x10\x80",  # a truncated varint
])
def test_malformed_chunks_are_left_to_protobuf_to_refuse(raw: bytes) -> None:
    try:
        expected = pb.UploadChunk.FromString(raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            chunks.decode(raw)
    else:
        assert chunks.decode(raw) == expected
