"""The judge's wire to the candidate's worker: framed messages (channel.py) and outputs as plain data (wire.py).
The worker end is hostile: anything malformed, oversized, too deep or late is a ChannelError / WireError before any
large allocation or any code runs, and comparisons of received outputs go through compare.py in chunks."""
import json
import os
import socket
import struct
import threading
import time

import pytest
import torch

from cuda_eval.judge import compare
from cuda_eval.protocol import channel, wire
from cuda_eval.protocol.channel import ChannelError


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_round_trip_with_blobs(pair):
    a, b = pair
    channel.send(a, {"op": "output", "x": [1, 2]}, [b"abc", bytearray(b""), memoryview(b"0123456789")])
    header, blobs = channel.recv(b, max_blobs=100)
    assert header["op"] == "output" and header["x"] == [1, 2] and header["blobs"] == [3, 0, 10]
    assert [bytes(x) for x in blobs] == [b"abc", b"", b"0123456789"]


def test_oversized_data_is_refused_before_it_is_read(pair):
    a, b = pair
    a.sendall(struct.pack(">QQ", 20, 1 << 40))  # claims a terabyte of data
    with pytest.raises(ChannelError, match="at most 100 accepted") as e:
        channel.recv(b, max_blobs=100)
    assert e.value.kind == "protocol"
    a.sendall(struct.pack(">QQ", 1 << 40, 0))
    with pytest.raises(ChannelError, match="header of"):
        channel.recv(b)


@pytest.mark.parametrize("head", [b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b'{"no_op": 1}', b'[1, 2]',
                                  b'{"op": "x", "blobs": [5]}', b'{"op": "x", "blobs": [-1]}'])
def test_malformed_headers_are_protocol_errors(pair, head):
    a, b = pair
    a.sendall(struct.pack(">QQ", len(head), 0) + head)
    with pytest.raises(ChannelError) as e:
        channel.recv(b, max_blobs=10)
    assert e.value.kind == "protocol"


def test_eof_and_deadline(pair):
    a, b = pair
    head = json.dumps({"op": "x", "blobs": [100]}).encode()
    a.sendall(struct.pack(">QQ", len(head), 100) + head + b"partial")
    with pytest.raises(ChannelError, match="no answer in time") as e:
        channel.recv(b, max_blobs=1000, deadline=time.monotonic() + 0.2)
    assert e.value.kind == "timeout"
    a.close()
    with pytest.raises(ChannelError) as e:
        channel.recv(b, max_blobs=1000)
    assert e.value.kind == "eof"


def test_numbers_from_the_worker():
    assert channel.finite(10 ** 400) is None and channel.finite(float("nan")) is None
    assert channel.finite(True) is None and channel.finite(2) == 2.0


def test_expect_raises_on_another_op(pair):
    a, b = pair
    channel.send(a, {"op": "error", "message": "boom"})
    with pytest.raises(ChannelError, match="expected 'loaded', got 'error': boom"):
        channel.expect(b, "loaded")


def test_a_descriptor_travels(pair):
    a, b = pair
    r, w = os.pipe()
    try:
        channel.send_fd(a, {"op": "job", "payload": {"k": 1}}, w)
        header, fd = channel.recv_fd(b)
        assert header["payload"] == {"k": 1} and fd is not None and fd != w
        os.write(fd, b"hi")
        os.close(fd)
        assert os.read(r, 2) == b"hi"
    finally:
        os.close(r)
        os.close(w)


def test_a_large_message_does_not_deadlock(pair):
    a, b = pair
    data = os.urandom(8 << 20)
    sender = threading.Thread(target=channel.send, args=(a, {"op": "big"}, [data]))
    sender.start()
    header, blobs = channel.recv(b, max_blobs=len(data))
    sender.join()
    assert bytes(blobs[0]) == data


def _through_the_wire(obj, max_bytes=1 << 30):
    tree, blobs = wire.pack(obj)
    tree = json.loads(json.dumps(tree))
    return wire.unpack(tree, [bytearray(b) for b in blobs], max_bytes=max_bytes)


def test_outputs_round_trip():
    x = torch.randn(3, 4)
    out = _through_the_wire((x, [torch.arange(5), torch.ones(2, dtype=torch.bfloat16)], 3, None, torch.tensor(True)))
    assert isinstance(out, tuple) and isinstance(out[1], list)
    assert torch.equal(out[0].tensor, x) and out[0].device == "cpu"
    assert torch.equal(out[1][0].tensor, torch.arange(5)) and out[1][1].tensor.dtype == torch.bfloat16
    assert out[2] == 3 and out[3] is None and out[4].tensor.item() is True
    weird = _through_the_wire([object()])
    assert isinstance(weird[0], wire.Opaque) and weird[0] != weird[0]


@pytest.mark.parametrize("tree, blobs, match", [
    ({"t": "tensor", "dtype": "float32", "shape": [4], "blob": 0}, [bytearray(15)], "with 15 bytes"),
    ({"t": "tensor", "dtype": "object", "shape": [1], "blob": 0}, [bytearray(8)], "malformed tensor"),
    ({"t": "tensor", "dtype": "float32", "shape": [-1], "blob": 0}, [bytearray(4)], "malformed tensor"),
    ({"t": "seq", "kind": "tuple", "items": [{"t": "tensor", "dtype": "uint8", "shape": [1], "blob": 0}] * 2},
     [bytearray(1)], "malformed tensor"),
    ({"t": "tensor", "dtype": "uint8", "shape": [1], "blob": 3}, [bytearray(1)], "malformed tensor"),
    ({"t": "value", "value": {"a": 1}}, [], "malformed value"),
    ({"t": "pickle", "data": "..."}, [], "unknown node"),
    ({"t": "tensor", "dtype": [], "shape": [1], "blob": 0}, [bytearray(1)], "malformed tensor"),
    ({"t": "tensor", "dtype": "float32", "shape": [0, 2 ** 39, 2 ** 39], "offset": 0}, [], "malformed tensor"),
    ({"t": "tensor", "dtype": "float32", "shape": [1] * 17, "blob": 0}, [bytearray(4)], "malformed tensor"),
    ({"t": "tensor", "dtype": "uint8", "shape": [64], "blob": 0}, [bytearray(64)], "at most 32 expected"),
])
def test_malformed_outputs_are_refused(tree, blobs, match):
    with pytest.raises(wire.WireError, match=match):
        wire.unpack(tree, blobs, max_bytes=32)


def test_too_deep_outputs_are_refused():
    tree = {"t": "value", "value": 1}
    for _ in range(wire.MAX_DEPTH + 2):
        tree = {"t": "seq", "kind": "list", "items": [tree]}
    with pytest.raises(wire.WireError, match="too deep"):
        wire.unpack(tree, [], max_bytes=0)


def test_received_outputs_compare_like_tensors(monkeypatch):
    ref = torch.randn(1000)
    got = _through_the_wire(ref.clone())
    assert compare.compare_outputs(got, ref, atol=1e-2, rtol=1e-2)["passed"]
    bad = ref.clone()
    bad[::7] += 1.0
    whole = compare.compare_outputs(_through_the_wire(bad), ref, atol=1e-2, rtol=1e-2)
    monkeypatch.setattr(compare, "CHUNK_ELEMENTS", 64)  # the same numbers, chunk by chunk
    chunked = compare.compare_outputs(_through_the_wire(bad), ref, atol=1e-2, rtol=1e-2)
    assert not whole["passed"] and whole == chunked and "143 of 1000 elements differ" in chunked["message"]
    other = wire.Received(ref.clone(), "cuda")
    assert "device mismatch: expected cpu, got cuda" in compare.compare_outputs(other, ref, atol=1, rtol=1)["message"]
    assert "expected a torch.Tensor, got builtins.object" in compare.compare_outputs(
        _through_the_wire(object()), ref, atol=1, rtol=1)["message"]


def test_outputs_through_shared_memory():
    """The judge's sealed memfd: the worker writes its outputs there, the judge copies them out at once, offsets
    outside the buffer are refused, and the worker (any holder of the descriptor) can neither shrink nor grow it
    (an access of the judge's mapping could otherwise fault)."""
    judge_side = wire.SharedBuffer(1 << 16)
    worker_side = wire.SharedBuffer(fd=os.dup(judge_side.fd))
    try:
        x, y = torch.randn(8, 16), torch.arange(7)
        tree, blobs = wire.pack((x, y, torch.ones(1 << 20)), worker_side)  # the third does not fit: a blob
        assert "offset" in tree["items"][0] and "offset" in tree["items"][1] and "blob" in tree["items"][2]
        out = wire.unpack(json.loads(json.dumps(tree)), [bytearray(b) for b in blobs], max_bytes=1 << 23,
                          shared=judge_side)
        assert torch.equal(out[0].tensor, x) and torch.equal(out[1].tensor, y) and out[2].tensor.numel() == 1 << 20
        torch.frombuffer(worker_side.map, dtype=torch.uint8).fill_(0)  # rewritten afterwards: the copy stands
        assert torch.equal(out[0].tensor, x)
        bad = {"t": "tensor", "dtype": "float32", "shape": [1 << 20], "device": "cpu", "offset": 0}
        with pytest.raises(wire.WireError, match="malformed"):
            wire.unpack(bad, [], max_bytes=1 << 30, shared=judge_side)
        with pytest.raises(wire.WireError, match="at most"):
            wire.unpack(dict(bad, shape=[64]), [], max_bytes=100, shared=judge_side)
        for size in (0, 1 << 20):
            with pytest.raises(PermissionError):
                os.ftruncate(worker_side.fd, size)
    finally:
        worker_side.close()
        judge_side.close()


def test_a_small_or_cpu_buffer_is_not_pinned():
    buf = wire.SharedBuffer(1 << 12)
    try:
        assert buf.pin() is False and not buf.pinned   # under PIN_MIN_BYTES (and no CUDA on CPU machines)
    finally:
        buf.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pinned_outputs_are_snapshotted_on_the_device(monkeypatch):
    """On a GPU both sides pin the buffer; the judge's copy goes straight to its device (one DMA transfer) and is a
    snapshot: rewriting the buffer afterwards changes nothing; past DEVICE_SNAPSHOT_MAX copies go to the host."""
    judge_side = wire.SharedBuffer(64 << 20)
    worker_side = wire.SharedBuffer(fd=os.dup(judge_side.fd))
    try:
        assert judge_side.pin() and worker_side.pin()
        x = torch.randn(1 << 22, device="cuda")
        tree, blobs = wire.pack((x, x[:5]), worker_side)
        assert not blobs
        out = wire.unpack(json.loads(json.dumps(tree)), [], max_bytes=64 << 20, shared=judge_side,
                          device=torch.device("cuda"))
        assert out[0].tensor.device.type == "cuda" and out[0].device == "cuda"
        assert torch.equal(out[0].tensor, x) and torch.equal(out[1].tensor, x[:5])
        torch.frombuffer(worker_side.map, dtype=torch.uint8).fill_(0)
        assert torch.equal(out[0].tensor, x)
        assert compare.compare_outputs(out[0], x, atol=0, rtol=0)["passed"]
        monkeypatch.setattr(wire, "DEVICE_SNAPSHOT_MAX", 1 << 20)
        tree, _ = wire.pack(x, worker_side)
        host = wire.unpack(tree, [], max_bytes=64 << 20, shared=judge_side, device=torch.device("cuda"))
        assert host.tensor.device.type == "cpu" and torch.equal(host.tensor, x.cpu())
    finally:
        worker_side.close()
        judge_side.close()
