"""The rollout worker streams the hidden states of a hashed share of its requests to the spot trainer
(``spot.stream_fraction``): exactly the selected requests arrive, each with one row per decode step."""

import time

import pytest

from services.rollout_actor.shard import RolloutRequest, streams_hidden
from services.rollout_actor.worker import RolloutWorker
from services.spot_trainer.buffer import HiddenStateBuffer
from services.spot_trainer.stream import HiddenStateReceiver

SAMPLING = dict(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=10)


def test_streams_hidden_is_a_stable_share_of_request_ids():
    ids = [f"s{s}-p{k}-g{j}" for s in range(4) for k in range(16) for j in range(8)]
    picked = [i for i in ids if streams_hidden(i, 0.25)]
    assert 0.18 < len(picked) / len(ids) < 0.32
    assert picked == [i for i in ids if streams_hidden(i, 0.25)]  # deterministic
    assert set(picked) <= {i for i in ids if streams_hidden(i, 0.5)}  # nested: a larger share adds requests
    assert all(streams_hidden(i, 1.0) for i in ids)


def test_only_the_selected_requests_hidden_states_are_streamed(tiny_policy_dir):
    learned_k2 = {"enabled": True, "drafter": "learned", "max_draft_tokens": 2}
    w = RolloutWorker(
        0, str(tiny_policy_dir), SAMPLING, max_batch_size=8, speculative=learned_k2, learned={"seed": 0}
    )
    buf = HiddenStateBuffer(capacity_tokens=100_000)
    rx = HiddenStateReceiver("tcp://127.0.0.1:*", buf)
    try:
        with pytest.raises(ValueError, match="stream_fraction"):
            w.connect_spot_trainer(rx.address, 0.0)
        assert w.connect_spot_trainer(rx.address, 0.5)
        reqs = [
            RolloutRequest(f"s1-p{i}-g{g}", f"p{i}", [5 + i, 6, 7, 8], 10 * i + g)
            for i in range(4)
            for g in range(4)
        ]
        want = {r.request_id for r in reqs if streams_hidden(r.request_id, 0.5)}
        assert 0 < len(want) < len(reqs)
        res = w.rollout(reqs, step=1)
        lengths = {o.request_id: len(o.token_ids) for o in res.outputs}
        deadline = time.monotonic() + 10
        while buf.num_frames < len(want) and time.monotonic() < deadline:
            rx.poll(100)
        frames = list(buf._frames)
        assert {f.request_id for f in frames} == want
        for f in frames:
            # one row per decode step's input token: every generated token but the last (the first comes
            # from the prefill)
            assert f.positions.shape[0] == lengths[f.request_id] - 1
        # a replayed sample (measure_speedup, learned drafts on) streams nothing and leaves nothing behind: the
        # next rollout of the same request ids streams frames of exactly its own tokens
        assert w.measure_speedup(reqs)["spec_tokens"] > 0
        rx.poll(200)
        assert buf.num_frames == len(want)
        res = w.rollout(reqs, step=2)
        lengths = {o.request_id: len(o.token_ids) for o in res.outputs}
        deadline = time.monotonic() + 10
        while buf.num_frames < 2 * len(want) and time.monotonic() < deadline:
            rx.poll(100)
        again = list(buf._frames)[len(want) :]
        assert {f.request_id for f in again} == want
        assert all(f.positions.shape[0] == lengths[f.request_id] - 1 for f in again)
    finally:
        w.close()
        rx.close()
