"""Hidden-state buffer (bounded, drop-oldest, age-out by policy version, sampling) and its ZeroMQ stream."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
import zmq

from services.spot_trainer.buffer import Frame, HiddenStateBuffer
from services.spot_trainer.stream import HiddenStateReceiver, HiddenStateSender, decode_frame, encode_frame


def frame(version: int, rid: str, n: int, d: int = 4, dtype=torch.float32, start: int = 0) -> Frame:
    pos = torch.arange(start, start + n, dtype=torch.int64)
    tokens = pos * 10 + version
    hidden = (tokens.to(torch.float32)[:, None] + torch.arange(d, dtype=torch.float32) / 8).to(dtype)
    return Frame(version, rid, pos, hidden, tokens)


# ---------------------------------------------------------------------- buffer
def test_frame_validation():
    with pytest.raises(ValueError):
        Frame(0, "r", torch.arange(3), torch.zeros(2, 4), torch.arange(3))  # row counts differ
    with pytest.raises(ValueError):
        Frame(0, "r", torch.arange(3), torch.zeros(3, 4, dtype=torch.int64), torch.arange(3))  # not float
    with pytest.raises(ValueError):
        Frame(0, "r", torch.arange(3, dtype=torch.int32), torch.zeros(3, 4), torch.arange(3))
    f = Frame.coerce((1, "r", np.arange(2), np.zeros((2, 3), np.float32), np.arange(2)))
    assert f.n == 2 and isinstance(f.hidden, torch.Tensor)


def test_bounded_buffer_drops_oldest_and_counts():
    buf = HiddenStateBuffer(capacity_tokens=10, keep_versions=4)
    for i in range(4):
        assert buf.add(frame(0, f"r{i}", 4))
    # 4 frames of 4 rows into 10 rows: each add beyond the second evicts the oldest
    assert len(buf) == 8 and buf.num_frames == 2
    assert buf.dropped == 2 and buf.dropped_tokens == 8 and buf.added == 4
    assert [f.request_id for f in buf.frames()] == ["r2", "r3"]
    buf.add(frame(0, "big", 25))  # longer than the capacity: keeps its last 10 rows
    assert len(buf) == 10 and buf.num_frames == 1 and buf.dropped == 4
    assert buf.dropped_tokens == 8 + 8 + 15
    assert buf.frames()[0].positions.tolist() == list(range(15, 25))


def test_age_out_by_policy_version():
    buf = HiddenStateBuffer(capacity_tokens=100, keep_versions=2)
    buf.add(frame(1, "a", 3))
    buf.add(frame(2, "b", 3))
    assert buf.num_fresh() == 6 and buf.current_version == 2
    buf.add(frame(3, "c", 3))  # version 3 arrives: keep versions 2, 3
    assert sorted(f.policy_version for f in buf.frames()) == [2, 3]
    assert buf.aged_out == 1 and buf.aged_out_tokens == 3
    assert not buf.add(frame(1, "late", 5))  # stale on arrival
    assert buf.aged_out_tokens == 8 and len(buf) == 6
    assert buf.num_fresh(current_version=4) == 3  # what would still be fresh at version 4
    assert buf.age_out(4) == 3 and len(buf) == 3
    assert buf.age_out(2) == 0 and buf.current_version == 4  # never goes back
    assert buf.age_out(10) == 3 and len(buf) == 0 and buf.num_fresh() == 0


def test_sample_rows_and_windows():
    buf = HiddenStateBuffer(capacity_tokens=100, keep_versions=2)
    buf.add(frame(1, "a", 5, d=3))
    buf.add(frame(2, "b", 2, d=3, start=40))
    b = buf.sample(64, np.random.default_rng(0))
    assert b["hidden"].shape == (64, 3) and b["tokens"].shape == (64,) and b["positions"].shape == (64,)
    assert torch.equal(b["tokens"], b["positions"] * 10 + b["policy_version"])
    assert torch.equal(b["hidden"][:, 0], b["tokens"].float())  # rows stay aligned
    assert set(b["policy_version"].tolist()) == {1, 2}
    w = buf.sample(32, 1, seq_len=3)  # only frame "a" has 3 rows
    assert w["hidden"].shape == (32, 3, 3) and w["tokens"].shape == (32, 3)
    assert (w["positions"][:, 1:] - w["positions"][:, :-1] == 1).all()
    assert (w["policy_version"] == 1).all()
    assert torch.equal(buf.sample(8, 7)["tokens"], buf.sample(8, 7)["tokens"])  # seeded
    with pytest.raises(ValueError):
        buf.sample(4, 0, seq_len=6)
    with pytest.raises(ValueError):
        HiddenStateBuffer(10).sample(1)


# ---------------------------------------------------------------------- wire format and ZeroMQ
def _drain(rx: HiddenStateReceiver, n: int, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while rx.received < n and time.monotonic() < end:
        rx.poll(50)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_encode_decode_exact(dtype):
    f = Frame(3, "req-7", torch.arange(5), torch.randn(5, 2, 6).to(dtype), torch.randint(0, 9, (5,)))
    g = decode_frame([bytes(memoryview(p)) for p in encode_frame(f)])
    assert (g.policy_version, g.request_id) == (3, "req-7")
    for name in ("positions", "hidden", "tokens"):
        a, b = getattr(f, name), getattr(g, name)
        assert a.dtype == b.dtype and torch.equal(a, b)
    empty = decode_frame(
        encode_frame(
            Frame(
                0,
                "e",
                torch.zeros(0, dtype=torch.int64),
                torch.zeros(0, 4),
                torch.zeros(0, dtype=torch.int64),
            )
        )
    )
    assert empty.n == 0 and empty.hidden.shape == (0, 4)


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
def test_zmq_round_trip_exact(kind, tmp_path):
    address = "tcp://127.0.0.1:*" if kind == "tcp" else f"ipc://{tmp_path}/hs.sock"
    buf = HiddenStateBuffer(capacity_tokens=10_000, keep_versions=4)
    sent = [
        Frame(1, "a", torch.arange(7), torch.randn(7, 16), torch.randint(0, 100, (7,))),
        Frame(
            2, "b", torch.arange(3, 300), torch.randn(297, 64).to(torch.bfloat16), torch.randint(0, 9, (297,))
        ),
        Frame(2, "c", torch.arange(1), torch.randn(1, 2, 3).half(), torch.tensor([5])),
    ]
    with HiddenStateReceiver(address, buf) as rx, HiddenStateSender(rx.address) as tx:
        for f in sent:
            assert tx.send(f)
        _drain(rx, len(sent))
        assert rx.stats() == dict(received=3, malformed=0, stale=0)
        assert tx.stats()["sent"] == 3 and tx.dropped == 0
    got = {f.request_id: f for f in buf.frames()}
    for f in sent:
        g = got[f.request_id]
        assert g.policy_version == f.policy_version
        for name in ("positions", "hidden", "tokens"):
            assert getattr(g, name).dtype == getattr(f, name).dtype
            assert torch.equal(getattr(g, name), getattr(f, name))


def test_receiver_counts_malformed_and_runs_in_thread():
    buf = HiddenStateBuffer(capacity_tokens=100)
    with HiddenStateReceiver("tcp://127.0.0.1:*", buf) as rx:
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.setsockopt(zmq.LINGER, 5000)  # close() delivers what is queued (LINGER 0 may drop it under load)
        raw.connect(rx.address)
        raw.send_multipart([b"not json", b"", b"", b""])
        raw.send_multipart([b"only one part"])
        raw.close()
        rx.start(poll_ms=10)
        with HiddenStateSender(rx.address) as tx:
            tx.send(frame(0, "ok", 3))
            end = time.monotonic() + 10
            while (rx.received < 3 or rx.malformed < 2) and time.monotonic() < end:
                time.sleep(0.01)
        rx.stop()
        assert rx.malformed == 2 and len(buf) == 3


def test_sender_never_blocks_without_receiver(tmp_path):
    tx = HiddenStateSender(f"ipc://{tmp_path}/nobody.sock", hwm=4)
    f = frame(0, "r", 64, d=256)

    def send_many():
        for _ in range(50):
            tx.send(f)

    t = threading.Thread(target=send_many)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "send blocked"
    assert tx.sent + tx.dropped == 50 and tx.dropped > 0 and tx.sent <= 8
    tx.close()


def test_slow_receiver_drops_are_counted():
    buf = HiddenStateBuffer(capacity_tokens=1 << 20, keep_versions=2)
    with (
        HiddenStateReceiver("tcp://127.0.0.1:*", buf, hwm=2) as rx,
        HiddenStateSender(rx.address, hwm=2) as tx,
    ):
        big = frame(0, "big", 256, d=1024)  # 1 MiB of hidden states per frame
        done = threading.Event()

        def send_many():
            for _ in range(100):  # nobody polls meanwhile: queues and socket buffers fill up
                tx.send(big)
            done.set()

        t = threading.Thread(target=send_many)
        t.start()
        t.join(timeout=60)
        assert done.is_set(), "send blocked"
        assert tx.sent + tx.dropped == 100 and tx.dropped > 0
        _drain(rx, tx.sent, timeout_s=10)
        assert rx.received == tx.sent and len(buf) == 256 * tx.sent
        assert torch.equal(buf.frames()[-1].hidden, big.hidden)
