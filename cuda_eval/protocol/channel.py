"""Framed messages over a Unix stream socket: how the judge, the candidate's worker and the evaluator talk.

A message is a JSON header plus zero or more binary blobs (tensor bytes):

    8 bytes  header length (big-endian)   8 bytes  total blob length   header JSON   blob bytes

The header lists the blob sizes (`"blobs": [n0, n1, ...]`). A receiver states how much it accepts before anything is
read (`max_header`, `max_blobs`); a message over those limits, a malformed header or a peer that stops mid-message is
a ChannelError, never a crash or an unbounded allocation: the candidate's worker is one end of such a socket and may
send anything. Importing this module does not import torch (the evaluator process uses it too).
"""
from __future__ import annotations

import json
import math
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

_PREFIX = struct.Struct(">QQ")
MAX_HEADER = 4 << 20


class ChannelError(Exception):
    """The peer closed the socket, sent something malformed or over the limits, or did not answer in time."""

    def __init__(self, message: str, *, kind: str = "protocol"):
        super().__init__(message)
        self.kind = kind  # "eof" | "timeout" | "protocol"


def send(sock: socket.socket, header: dict, blobs: Sequence[bytes | bytearray | memoryview] = ()) -> None:
    views = [memoryview(b).cast("B") for b in blobs]
    head = json.dumps(dict(header, blobs=[len(v) for v in views]), default=str).encode()
    try:
        sock.sendall(_PREFIX.pack(len(head), sum(len(v) for v in views)) + head)
        for v in views:
            sock.sendall(v)
    except OSError as e:
        raise ChannelError(f"the peer is gone ({type(e).__name__}: {e})", kind="eof") from None


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        _set_timeout(sock, deadline)
        try:
            k = sock.recv_into(view[got:], min(n - got, 16 << 20))
        except socket.timeout:
            raise ChannelError("no answer in time", kind="timeout") from None
        except OSError as e:
            raise ChannelError(f"the peer is gone ({type(e).__name__}: {e})", kind="eof") from None
        if k == 0:
            raise ChannelError("the peer closed the connection" + (" mid-message" if got else ""), kind="eof")
        got += k
    return buf


def _set_timeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise ChannelError("no answer in time", kind="timeout")
    sock.settimeout(left)


def recv(sock: socket.socket, *, max_blobs: int = 0, max_header: int = MAX_HEADER,
         deadline: float | None = None) -> tuple[dict, list[bytearray]]:
    """(header, blobs) of the next message; `deadline` is a time.monotonic() value (None: wait forever)."""
    header_len, blob_len = _PREFIX.unpack(bytes(_read_exact(sock, _PREFIX.size, deadline)))
    if header_len > max_header:
        raise ChannelError(f"message header of {header_len} bytes (at most {max_header} accepted)")
    if blob_len > max_blobs:
        raise ChannelError(f"message data of {blob_len} bytes (at most {max_blobs} accepted here)")
    try:
        header = json.loads(bytes(_read_exact(sock, header_len, deadline)))
    except (ValueError, UnicodeDecodeError, RecursionError, MemoryError) as e:
        raise ChannelError(f"malformed message header ({type(e).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("op"), str):
        raise ChannelError("malformed message header (no 'op')")
    sizes = header.get("blobs")
    if not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes) or \
            sum(sizes) != blob_len:
        raise ChannelError("malformed message header (blob sizes)")
    blobs = [_read_exact(sock, s, deadline) for s in sizes]
    return header, blobs


def expect(sock: socket.socket, op: str, **kw) -> tuple[dict, list[bytearray]]:
    """recv(), and a ChannelError unless the message is `op` (an "error" message's text is raised with it)."""
    header, blobs = recv(sock, **kw)
    if header["op"] != op:
        detail = f": {str(header.get('message'))[:3000]}" if header["op"] == "error" else ""
        raise ChannelError(f"expected {op!r}, got {header['op']!r}{detail}", kind="unexpected")
    return header, blobs


def send_fd(sock: socket.socket, header: dict, fd: int) -> None:
    """A header-only message carrying one open descriptor (SCM_RIGHTS)."""
    head = json.dumps(dict(header, blobs=[]), default=str).encode()
    data = _PREFIX.pack(len(head), 0) + head
    sent = socket.send_fds(sock, [data], [fd])  # one sendmsg: a large header may go out in part
    if sent < len(data):
        sock.sendall(data[sent:])


def recv_fd(sock: socket.socket, *, max_header: int = MAX_HEADER) -> tuple[dict, int | None]:
    """The header and descriptor of a send_fd() message (None if it carried none). Blocking, trusted peers only."""
    data, fds, _, _ = socket.recv_fds(sock, _PREFIX.size, 4)
    if len(data) < _PREFIX.size:
        if not data:
            raise ChannelError("the peer closed the connection", kind="eof")
        data = bytes(data) + bytes(_read_exact(sock, _PREFIX.size - len(data), None))
    header_len, blob_len = _PREFIX.unpack(data)
    if header_len > max_header or blob_len:
        raise ChannelError("malformed descriptor message")
    header = json.loads(bytes(_read_exact(sock, header_len, None)))
    for extra in fds[1:]:
        _close(extra)
    return header, (fds[0] if fds else None)


def output_memfd(size: int) -> int:
    """A sealed memfd of `size` bytes for one job's outputs (wire.SharedBuffer maps it): sealed against shrinking
    and growing, so no peer can make another's mapping fault or hold more memory than was granted. Sparse: only the
    pages written take memory. Created by the pool, whose process runs under none of the limits meant for candidates
    (RLIMIT_FSIZE covers memfds too: a judge under the workers' 4 GiB could not size the channel of a 6 GiB output).
    OSError (EFBIG, ENOMEM) when it cannot be made."""
    import fcntl
    import os
    fd = os.memfd_create("cuda_eval-outputs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(int(size), 1))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _close(fd: int) -> None:
    import os
    try:
        os.close(fd)
    except OSError:
        pass


def finite(x: Any) -> float | None:
    """A float from untrusted data, or None if it is not a finite number."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        x = float(x)
    except OverflowError:  # an int of hundreds of digits
        return None
    return x if math.isfinite(x) else None
