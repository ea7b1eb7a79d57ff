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

Authentication and hostile input
--------------------------------
With the run's secret (``token``; the pipeline hands it to both ends through Ray) every message carries a
fifth part, an HMAC-SHA256 over the four others (key: ``stream_key(token)``, each part length-prefixed). A
receiver with a key drops every message without a valid MAC before it parses anything. Every frame is also
checked before it reaches the buffer: header size, JSON shape, dtypes (positions / tokens int64, hidden a
float type), byte counts, and ranges: ``policy_version`` at most ``max_version_ahead`` ahead of the policy
version the receiver was told (``set_policy_version``, by its owner through Ray; a frame far ahead is not
adopted, it would make every later frame stale), token ids inside ``vocab_size``, positions >= 0, hidden width
``hidden_size``. Dropped frames are counted by reason (``malformed``, ``unauthenticated``, ``out_of_range``,
``stale``, ``error``) in ``dropped`` and in the Prometheus counter ``tailspec_stream_frames_dropped_total``;
the receiver thread never dies from input.

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

import hashlib
import hmac
import json
import logging
import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
import zmq

from services.common.metrics import METRICS, Metrics, installed_process_metrics
from services.spot_trainer.buffer import Frame, HiddenStateBuffer

FMT = 1
_NAMES = ("positions", "hidden", "tokens")
MAX_HEADER_BYTES = 64 * 1024
MAX_REQUEST_ID = 512
_INT_DTYPES = {"int64"}
_FLOAT_DTYPES = {"float32", "float16", "bfloat16", "float64"}
DROP_REASONS = ("malformed", "unauthenticated", "out_of_range", "stale", "error")
log = logging.getLogger(__name__)


def stream_key(token: str | None) -> bytes | None:
    """The MAC key of the hidden-state stream, derived from the run's secret (None without one)."""
    if not token:
        return None
    return hmac.new(token.encode(), b"tailspec hidden-state stream v1", hashlib.sha256).digest()


def frame_mac(key: bytes, parts: Sequence[Any]) -> bytes:
    """HMAC-SHA256 over the four frame parts, each prefixed with its length (no ambiguity in the split)."""
    mac = hmac.new(key, b"tailspec-frame-v1", hashlib.sha256)
    for part in parts:
        buf = part.buffer if isinstance(part, zmq.Frame) else memoryview(part)
        mac.update(len(buf).to_bytes(8, "little"))
        mac.update(buf)
    return mac.digest()


class FrameDropped(ValueError):
    """A received message that is not stored; ``reason`` is one of ``DROP_REASONS``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


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


def _header(part) -> dict:
    """The frame header, checked for shape and types (``FrameDropped("malformed")`` otherwise)."""

    def bad(msg: str) -> FrameDropped:
        return FrameDropped("malformed", msg)

    raw = part.buffer if isinstance(part, zmq.Frame) else memoryview(part)
    if len(raw) > MAX_HEADER_BYTES:
        raise bad(f"header of {len(raw)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(bytes(raw))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"header is not JSON: {e}") from None
    if not isinstance(header, dict) or header.get("fmt") != FMT:
        raise bad(f"unsupported frame format {header.get('fmt') if isinstance(header, dict) else header!r}")
    pv, rid = header.get("policy_version"), header.get("request_id")
    if not isinstance(pv, int) or isinstance(pv, bool):
        raise bad(f"policy_version {pv!r} is not an int")
    if not isinstance(rid, str) or len(rid) > MAX_REQUEST_ID:
        raise bad("request_id is not a string of at most 512 characters")
    shapes, dtypes = header.get("shapes"), header.get("dtypes")
    if not isinstance(shapes, dict) or not isinstance(dtypes, dict):
        raise bad("shapes and dtypes must be objects")
    for name in _NAMES:
        shape, dt = shapes.get(name), dtypes.get(name)
        if not isinstance(shape, list) or not 1 <= len(shape) <= 4:
            raise bad(f"{name}: shape {shape!r} is not a list of 1..4 dims")
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 or d >= 2**31 for d in shape):
            raise bad(f"{name}: shape {shape!r} has a bad dim")
        allowed = _FLOAT_DTYPES if name == "hidden" else _INT_DTYPES
        if dt not in allowed:
            raise bad(f"{name}: dtype {dt!r} is not one of {sorted(allowed)}")
    return header


def decode_frame(parts: Sequence[Any]) -> Frame:
    """Inverse of ``encode_frame`` (parts: ``zmq.Frame`` objects or bytes-like). Raises ``FrameDropped``
    (a ``ValueError``) with reason ``malformed`` for anything else."""
    if len(parts) != 4:
        raise FrameDropped("malformed", f"expected 4 message parts, got {len(parts)}")
    header = _header(parts[0])
    out = {}
    for name, part in zip(_NAMES, parts[1:]):
        shape, dt = tuple(header["shapes"][name]), _dtype(header["dtypes"][name])
        buf = _buffer_of(part)
        numel = math.prod(shape)
        if len(buf) != numel * torch.empty((), dtype=dt).element_size():
            raise FrameDropped("malformed", f"{name}: {len(buf)} bytes do not match shape {shape} of {dt}")
        out[name] = (
            torch.empty(shape, dtype=dt) if numel == 0 else torch.frombuffer(buf, dtype=dt).view(shape)
        )
    try:
        return Frame(
            header["policy_version"], header["request_id"], out["positions"], out["hidden"], out["tokens"]
        )
    except ValueError as e:
        raise FrameDropped("malformed", str(e)) from None


class HiddenStateSender:
    """Rollout side: PUSH socket connected to the spot trainer's receiver(s). Never blocks.

    Args:
        address: one ZeroMQ endpoint, or a non-empty list of them (one per spot-trainer replica: frames are
            dealt round-robin across them, see "Several spot-trainer replicas").
        hwm: send high-water mark, in frames, per connected endpoint.
        token: the run's secret: every message then carries its MAC (``frame_mac``).
    Raises: ValueError for an empty list; ``zmq.ZMQError`` for a malformed endpoint.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        hwm: int = 64,
        context: zmq.Context | None = None,
        token: str | None = None,
    ):
        self._key = stream_key(token)
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
        if self._key is not None:
            parts.append(frame_mac(self._key, parts))
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


_default_metrics = None
_default_metrics_lock = threading.Lock()


def _stream_counter(metrics: Any = None):
    """``tailspec_stream_frames_dropped_total`` on ``metrics`` (a ``Metrics``), else on the driver's (installed
    when the spot trainer runs in its process), else on a process-wide one."""
    global _default_metrics
    if metrics is None:
        metrics = installed_process_metrics()
    metrics = getattr(metrics, "metrics", metrics)  # a TailspecMetrics: its Metrics
    if metrics is None:
        with _default_metrics_lock:
            if _default_metrics is None:
                _default_metrics = Metrics()
            metrics = _default_metrics
    spec = next(m for m in METRICS if m.name == "tailspec_stream_frames_dropped_total")
    return metrics.from_spec(spec)


class HiddenStateReceiver:
    """Spot-trainer side: PULL socket bound at ``address``, feeding ``buffer``.

    Args:
        token: the run's secret: only messages with a valid MAC are accepted (see "Authentication").
        policy_version: the policy version to bound frames by (``set_policy_version`` moves it); None = not
            bounded until a version is set (a receiver without an owner that knows the policy).
        max_version_ahead: frames more than this ahead of ``policy_version`` are dropped (``out_of_range``).
        hidden_size / vocab_size: when given, a frame's hidden width and token ids must fit them.
        metrics: a ``services.common.metrics.Metrics`` for the drop counter (default: a process-wide one).
        max_message_bytes: ZeroMQ drops a peer that sends a larger message part (memory bound).
    """

    def __init__(
        self,
        address: str,
        buffer: HiddenStateBuffer,
        hwm: int = 64,
        context: zmq.Context | None = None,
        *,
        token: str | None = None,
        policy_version: int | None = None,
        max_version_ahead: int = 1,
        hidden_size: int | None = None,
        vocab_size: int | None = None,
        metrics: Any = None,
        max_message_bytes: int = 1 << 30,
    ):
        self._key = stream_key(token)
        self.policy_version = None if policy_version is None else int(policy_version)
        self.max_version_ahead = int(max_version_ahead)
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self._counter = _stream_counter(metrics)
        for reason in DROP_REASONS:  # every series exists from the start, at 0
            self._counter.touch({"reason": reason})
        self.buffer = buffer
        self._sock = (context or zmq.Context.instance()).socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, int(hwm))
        self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))  # a bigger part: the peer is dropped
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
                self._take(parts)
            except FrameDropped as e:
                self._drop(e.reason)
            except Exception as e:  # noqa: BLE001 - no input may end the receiver
                log.warning("hidden-state frame dropped: %s: %s", type(e).__name__, e)
                self._drop("error")
        return n

    def set_policy_version(self, version: int) -> int:
        """The policy version frames are bounded by (never goes back); returns it."""
        v = int(version)
        self.policy_version = v if self.policy_version is None else max(self.policy_version, v)
        return self.policy_version

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1
        if reason == "malformed":
            self.malformed += 1
        elif reason == "stale":
            self.stale += 1
        try:
            self._counter.inc(1, {"reason": reason})
        except Exception:  # noqa: BLE001 - metrics are best effort
            pass

    def _take(self, parts: Sequence[Any]) -> None:
        """Authenticate, decode, range-check and store one message (``FrameDropped`` when not stored)."""
        if self._key is not None:
            if len(parts) != 5:
                raise FrameDropped("unauthenticated", f"{len(parts)} parts: no MAC")
            mac = parts[4].bytes if isinstance(parts[4], zmq.Frame) else bytes(parts[4])
            if not hmac.compare_digest(mac, frame_mac(self._key, parts[:4])):
                raise FrameDropped("unauthenticated", "bad MAC")
            parts = parts[:4]
        frame = decode_frame(parts)
        self._check_range(frame)
        if not self.buffer.add(frame):
            raise FrameDropped("stale", "older than the buffer's last policy versions")

    def _check_range(self, f: Frame) -> None:
        def out(msg: str) -> FrameDropped:
            return FrameDropped("out_of_range", msg)

        pv = self.policy_version
        if f.policy_version < 0 or (pv is not None and f.policy_version > pv + self.max_version_ahead):
            raise out(f"policy_version {f.policy_version}: the policy is at {pv}")
        if f.n and int(f.positions.min()) < 0:
            raise out("negative position")
        if f.n and self.vocab_size is not None:
            lo, hi = int(f.tokens.min()), int(f.tokens.max())
            if lo < 0 or hi >= self.vocab_size:
                raise out(f"token ids {lo}..{hi} outside the vocabulary of {self.vocab_size}")
        if self.hidden_size is not None and (f.hidden.dim() < 2 or f.hidden.shape[-1] != self.hidden_size):
            raise out(f"hidden shape {tuple(f.hidden.shape)} does not end in {self.hidden_size}")
        if f.n and not bool(torch.isfinite(f.hidden).all()):
            raise out("non-finite hidden states")

    def start(self, poll_ms: int = 50) -> None:
        """Poll in a daemon thread until ``stop()`` (the thread then owns the socket)."""
        if self._thread is not None:
            return
        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                try:
                    self.poll(poll_ms)
                except zmq.ZMQError as e:  # the socket closed under us: stop
                    if self._sock.closed:
                        return
                    log.warning("hidden-state receiver: %s", e)
                except Exception as e:  # noqa: BLE001 - the receiver never dies from input
                    log.warning("hidden-state receiver: %s: %s", type(e).__name__, e)

        self._thread = threading.Thread(target=loop, name="hidden-state-receiver", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def stats(self) -> dict[str, int]:
        """Received, malformed and stale frame counts (every drop reason: ``dropped``)."""
        return dict(received=self.received, malformed=self.malformed, stale=self.stale)

    def close(self) -> None:
        self.stop()
        if not self._sock.closed:
            self._sock.close(linger=0)

    def __enter__(self) -> HiddenStateReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
