"""Hidden-state stream from the rollout actors to the spot trainer's buffer over ZeroMQ (PUSH/PULL).

Bulk tensors never go through gRPC (docs/architecture.md, "Control plane and data plane"): each rollout actor
owns a ``HiddenStateSender`` (PUSH, connects) and the spot trainer one ``HiddenStateReceiver`` (PULL, binds)
that feeds a ``HiddenStateBuffer``.

Wire format (one multipart message per frame)
---------------------------------------------
``[header, positions, hidden, tokens]``: ``header`` is UTF-8 JSON ``{"fmt": 1, "policy_version": int,
"request_id": str, "shapes": {name: [dims]}, "dtypes": {name: torch dtype name}}``; the other three parts
are the raw bytes of the C-contiguous CPU tensors (any torch dtype, bfloat16 included), native byte order
(both ends run on the same kind of machine).

Contract
--------
- Zero copy: the sender hands the tensors' own memory to ZeroMQ (``copy=False``; ZeroMQ still copies
  messages below pyzmq's ``COPY_THRESHOLD``, 64 KiB, where that is cheaper). The caller must not modify the
  tensors in place after ``send`` (clone first if the engine reuses its buffers). CUDA tensors are copied to
  the CPU first. The receiver builds tensors directly over the received message memory (``torch.frombuffer``),
  so the buffer stores views of the ZeroMQ frames, no copy.
- The sender never blocks decoding: ``send`` uses ``NOBLOCK`` and a bounded send high-water mark (``hwm``
  messages); when the receiver is slow or absent and the queue is full, the frame is dropped and counted in
  ``dropped``. ``send`` returns whether the frame was queued. Sockets close with ``LINGER=0``.
- ``HiddenStateReceiver.poll(timeout_ms)`` waits up to ``timeout_ms`` for the first message, then drains
  everything already queued (up to ``max_frames``) into the buffer; undecodable messages are counted in
  ``malformed`` and skipped. Bind to ``tcp://127.0.0.1:*`` (``address`` tells the port chosen) or ``ipc://``.
- A socket belongs to one thread at a time: call ``poll`` yourself, or ``start()`` a background thread that
  polls until ``stop()``.

Several spot-trainer replicas (data sharding)
---------------------------------------------
``HiddenStateSender`` takes one address or a list of them (one per spot-trainer replica) and connects its
single PUSH socket to every one. ZeroMQ PUSH deals whole messages round-robin over the connected peers whose
queues have room, so each frame goes to exactly one replica and each replica's buffer holds a disjoint share
of the stream: that is the data sharding of the data-parallel spot trainer (``service.py``). The high-water
mark is per peer (up to ``hwm`` frames queued for each replica); a slow or absent replica's queue fills and
is then skipped, and a frame is dropped only when every queue is full.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import torch
import zmq

from services.spot_trainer.buffer import Frame, HiddenStateBuffer

FMT = 1
_NAMES = ("positions", "hidden", "tokens")


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def _raw(t: torch.Tensor):
    """The tensor's bytes as a buffer-protocol object sharing its memory (CPU, C-contiguous)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy()


def encode_frame(frame: Frame | Sequence[Any]) -> list:
    """The multipart message of one frame (header bytes + three zero-copy tensor buffers)."""
    f = Frame.coerce(frame)
    tensors = dict(positions=f.positions, hidden=f.hidden, tokens=f.tokens)
    header = dict(
        fmt=FMT,
        policy_version=f.policy_version,
        request_id=f.request_id,
        shapes={k: list(v.shape) for k, v in tensors.items()},
        dtypes={k: _dtype_name(v.dtype) for k, v in tensors.items()},
    )
    return [json.dumps(header).encode()] + [_raw(tensors[k]) for k in _NAMES]


def _buffer_of(part) -> Any:
    """A writable buffer over the part: zero-copy for ``zmq.Frame`` (its memory is writable), a copy for
    read-only bytes (torch tensors over read-only memory are unsafe)."""
    buf = part.buffer if isinstance(part, zmq.Frame) else memoryview(part)
    return memoryview(bytearray(buf)) if buf.readonly else buf


def decode_frame(parts: Sequence[Any]) -> Frame:
    """Inverse of ``encode_frame`` (parts: ``zmq.Frame`` objects or bytes-like)."""
    if len(parts) != 4:
        raise ValueError(f"expected 4 message parts, got {len(parts)}")
    header = json.loads(bytes(_buffer_of(parts[0])))
    if header.get("fmt") != FMT:
        raise ValueError(f"unsupported frame format {header.get('fmt')!r}")
    out = {}
    for name, part in zip(_NAMES, parts[1:]):
        shape, dt = tuple(header["shapes"][name]), _dtype(header["dtypes"][name])
        buf = _buffer_of(part)
        numel = 1
        for d in shape:
            numel *= d
        if len(buf) != numel * torch.empty((), dtype=dt).element_size():
            raise ValueError(f"{name}: {len(buf)} bytes do not match shape {shape} of {dt}")
        out[name] = (
            torch.empty(shape, dtype=dt) if numel == 0 else torch.frombuffer(buf, dtype=dt).view(shape)
        )
    return Frame(
        header["policy_version"], header["request_id"], out["positions"], out["hidden"], out["tokens"]
    )


class HiddenStateSender:
    """Rollout side: PUSH socket connected to the spot trainer's receiver(s). Never blocks.

    Args:
        address: one ZeroMQ endpoint, or a non-empty list of them (one per spot-trainer replica: frames are
            dealt round-robin across them, see "Several spot-trainer replicas").
        hwm: send high-water mark, in frames, per connected endpoint.
    Raises: ValueError for an empty list; ``zmq.ZMQError`` for a malformed endpoint.
    """

    def __init__(self, address: str | Sequence[str], hwm: int = 64, context: zmq.Context | None = None):
        self.addresses: list[str] = [address] if isinstance(address, str) else [str(a) for a in address]
        if not self.addresses:
            raise ValueError("HiddenStateSender needs at least one address")
        self.address = self.addresses[0] if len(self.addresses) == 1 else ",".join(self.addresses)
        self._sock = (context or zmq.Context.instance()).socket(zmq.PUSH)
        self._sock.setsockopt(zmq.SNDHWM, int(hwm))
        self._sock.setsockopt(zmq.LINGER, 0)
        for a in self.addresses:
            self._sock.connect(a)
        self.sent = 0
        self.dropped = 0
        self.sent_bytes = 0

    def send(self, frame: Frame | Sequence[Any]) -> bool:
        """Queue one frame without blocking; False (and ``dropped += 1``) when the queue is full."""
        parts = encode_frame(frame)
        try:
            self._sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        self.sent_bytes += sum(len(memoryview(p)) for p in parts)
        return True

    def stats(self) -> dict[str, int]:
        return dict(sent=self.sent, dropped=self.dropped, sent_bytes=self.sent_bytes)

    def close(self) -> None:
        if not self._sock.closed:
            self._sock.close(linger=0)

    def __enter__(self) -> HiddenStateSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HiddenStateReceiver:
    """Spot-trainer side: PULL socket bound at ``address``, feeding ``buffer``."""

    def __init__(
        self,
        address: str,
        buffer: HiddenStateBuffer,
        hwm: int = 64,
        context: zmq.Context | None = None,
    ):
        self.buffer = buffer
        self._sock = (context or zmq.Context.instance()).socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, int(hwm))
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address: str = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.received = 0
        self.malformed = 0
        self.stale = 0  # frames the buffer refused as older than its last K policy versions
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def poll(self, timeout_ms: int = 0, max_frames: int | None = None) -> int:
        """Wait up to ``timeout_ms`` for a message, then pull all queued frames into the buffer.
        Returns the number of frames received (stored or not)."""
        if self._sock.poll(timeout_ms, zmq.POLLIN) == 0:
            return 0
        n = 0
        while max_frames is None or n < max_frames:
            try:
                parts = self._sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            n += 1
            self.received += 1
            try:
                frame = decode_frame(parts)
            except (ValueError, KeyError, TypeError):
                self.malformed += 1
                continue
            if not self.buffer.add(frame):
                self.stale += 1
        return n

    def start(self, poll_ms: int = 50) -> None:
        """Poll in a daemon thread until ``stop()`` (the thread then owns the socket)."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                self.poll(poll_ms)

        self._thread = threading.Thread(target=loop, name="hidden-state-receiver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def stats(self) -> dict[str, int]:
        return dict(received=self.received, malformed=self.malformed, stale=self.stale)

    def close(self) -> None:
        self.stop()
        if not self._sock.closed:
            self._sock.close(linger=0)

    def __enter__(self) -> HiddenStateReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
