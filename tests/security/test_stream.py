"""(c) The hidden-state stream of a real spot-trainer replica under attack from another process: random bytes,
frames without or with a wrong MAC, and (from a sender holding the key) a huge policy version, token ids
outside the vocabulary, NaN hidden states and a non-JSON header are dropped and counted by reason (in the
replica's counters and the Prometheus counter ``tailspec_stream_frames_dropped_total``); the huge version is
not adopted, the receiver thread lives on, later good frames are stored and drafter training goes on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from services.common.config import REPO_ROOT
from services.spot_trainer import stream
from services.spot_trainer.buffer import Frame
from services.spot_trainer.service import SpotTrainerService
from services.spot_trainer.stream import HiddenStateReceiver, HiddenStateSender
from tests.spot_trainer.conftest import FRAME_LEN, wait_for

TOKEN = "stream-test-secret"


def _dropped_counter() -> dict[str, float]:
    """reason -> value of tailspec_stream_frames_dropped_total in this process's default registry."""
    text = stream._default_metrics.exposition().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^tailspec_stream_frames_dropped_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    }


def _good_frames(svc: SpotTrainerService, n: int, version: int = 0) -> list[Frame]:
    cfg = svc.target.config
    g = torch.Generator().manual_seed(1)
    return [
        Frame(
            version,
            f"good-{i}",
            torch.arange(FRAME_LEN),
            torch.randn(FRAME_LEN, 1, cfg.hidden_size, generator=g),
            torch.randint(0, cfg.vocab_size, (FRAME_LEN,), generator=g),
        )
        for i in range(n)
    ]


def _attack(endpoint: str, token: str | None) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    args = [sys.executable, "-m", "tests.security.stream_attacker", endpoint] + ([token] if token else [])
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.strip())


def test_hostile_frames_are_counted_and_dropped_while_training_goes_on(
    tmp_path, tiny_policy_dir, monkeypatch
):
    # the process-wide counter on a registry of its own (Ray, started by an earlier test, would take it over)
    from prometheus_client import CollectorRegistry

    from services.common.metrics import Metrics

    monkeypatch.setattr(
        stream, "_default_metrics", Metrics(backend="prometheus", registry=CollectorRegistry())
    )
    svc = SpotTrainerService(
        str(tiny_policy_dir),
        str(tmp_path / "spot"),
        batch_size=4,
        seq_len=4,
        min_samples=8,
        checkpoint_every=1000,
        token=TOKEN,
    )
    try:
        rx = svc.receiver
        before = _dropped_counter()
        assert set(before) == set(stream.DROP_REASONS)  # every series exists from the start
        sent = _attack(svc.address(), None) + _attack(svc.address(), TOKEN)
        assert sent == 12
        assert wait_for(lambda: rx.received >= sent, timeout=120)
        assert rx.dropped == dict(unauthenticated=4 + 4, out_of_range=3, malformed=1, stale=0, error=0)
        after = _dropped_counter()
        assert {r: after[r] - before.get(r, 0.0) for r in after} == {
            r: float(n) for r, n in rx.dropped.items()
        }
        assert len(svc.buffer) == 0 and svc.buffer.current_version is None  # the huge version not adopted
        assert rx._thread is not None and rx._thread.is_alive()

        # later good frames (the real sender: the run's key) are still received
        with HiddenStateSender(svc.address(), token=TOKEN) as tx:
            for f in _good_frames(svc, 6):
                assert tx.send(f)
            assert wait_for(lambda: svc.num_fresh() >= 6 * FRAME_LEN, timeout=120)
        assert svc.num_fresh() == 6 * FRAME_LEN and svc.buffer.current_version == 0

        # and drafter training goes on
        ans = svc.grant(dict(grant_id="1", worker_id="0", deadline=time.time() + 600))
        assert ans["accepted"], ans
        assert wait_for(lambda: svc.spot.step >= 2, timeout=300)
        out = svc.preempt("1", timeout=120)
        assert out["released"] and out["steps_in_grant"] >= 2 and out["stop_reason"] == "preempted"
    finally:
        svc.close()


def test_policy_version_bound_follows_the_policy(tmp_path):
    """A frame more than one version ahead of what the owner said is out of range; once the policy moves
    (through the owner, never a frame), it is accepted."""
    from services.spot_trainer.buffer import HiddenStateBuffer

    buf = HiddenStateBuffer(capacity_tokens=10_000, keep_versions=2)
    with (
        HiddenStateReceiver("tcp://127.0.0.1:*", buf, token=TOKEN, policy_version=3, hidden_size=4) as rx,
        HiddenStateSender(rx.address, token=TOKEN) as tx,
    ):

        def push(version: int) -> None:
            n = rx.received
            tx.send(Frame(version, f"v{version}", torch.arange(2), torch.randn(2, 4), torch.tensor([1, 2])))
            assert wait_for(lambda: rx.poll(50) >= 0 and rx.received > n, timeout=60)

        push(4)  # one ahead: fine (the rollout side may be a version ahead of the spot trainer)
        push(6)
        assert rx.dropped["out_of_range"] == 1 and buf.current_version == 4
        rx.set_policy_version(5)
        push(6)
        assert rx.dropped["out_of_range"] == 1 and buf.current_version == 6
        rx.set_policy_version(2)  # never back
        assert rx.policy_version == 5


@pytest.mark.parametrize("keyed_sender", [False, True])
def test_unkeyed_and_keyed_ends_do_not_mix(keyed_sender):
    """A keyed receiver refuses frames without the MAC; an unkeyed one refuses frames that carry one (5 parts)."""
    from services.spot_trainer.buffer import HiddenStateBuffer

    buf = HiddenStateBuffer(capacity_tokens=1000)
    token_rx = None if keyed_sender else TOKEN
    with (
        HiddenStateReceiver("tcp://127.0.0.1:*", buf, token=token_rx) as rx,
        HiddenStateSender(rx.address, token=TOKEN if keyed_sender else None) as tx,
    ):
        tx.send(Frame(0, "r", torch.arange(2), torch.randn(2, 4), torch.tensor([1, 2])))
        assert wait_for(lambda: rx.poll(50) >= 0 and rx.received == 1, timeout=60)
    assert len(buf) == 0
    assert rx.dropped["malformed" if keyed_sender else "unauthenticated"] == 1
