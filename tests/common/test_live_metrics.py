"""Live metrics: the coordinator exports a worker's state on every transition, a rollout actor its active batch
size at every decode step, and the run's labelled series exist at zero before step 1."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common import metrics as metrics_module
from services.common.metrics import (
    WORKER_STATES,
    Metrics,
    TailspecMetrics,
    bucket_label,
    install_process_metrics,
    installed_process_metrics,
    process_metrics,
    table_arm_buckets,
)
from services.coordinator.service import CoordinatorActor
from services.rollout_actor.shard import RolloutRequest
from services.rollout_actor.worker import RolloutWorker, choices_by_bucket

SAMPLING = dict(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=12)


def _samples(tm: TailspecMetrics) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(tm.metrics.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def installed():
    tm = TailspecMetrics(Metrics(backend="prometheus"))
    install_process_metrics(tm)
    yield tm
    install_process_metrics(None)


def _state_of(tm: TailspecMetrics, worker: str) -> list[str]:
    s = _samples(tm)
    return [
        st
        for st in WORKER_STATES
        if s.get(("tailspec_worker_state", (("state", st), ("worker", worker)))) == 1
    ]


def test_process_metrics_is_the_installed_one_unless_disabled(installed, monkeypatch):
    assert process_metrics() is installed and process_metrics(enabled=False) is None
    install_process_metrics(None)
    monkeypatch.setattr(metrics_module, "ray_active", lambda: False)
    assert process_metrics() is None  # not a Ray worker, nothing installed: no exporter
    assert installed_process_metrics() is None


def test_worker_state_is_exported_on_every_transition(installed):
    actor = CoordinatorActor(heartbeat_timeout_s=30.0, worker_ids=["0", "1"], metrics=True)
    c = actor.coordinator
    try:
        c.register("0")
        assert _state_of(installed, "0") == ["STARTING"] and _state_of(installed, "1") == []
        c.ready("0")
        assert _state_of(installed, "0") == ["IDLE"]
        c.rollout_started("0", 1)
        assert _state_of(installed, "0") == ["ROLLOUT"]
        c.rollout_finished("0")
        assert _state_of(installed, "0") == ["IDLE"]
        c.fail("0", "test")
        assert _state_of(installed, "0") == ["FAILED"]
        c.register("0")  # a restarted worker: FAILED -> STARTING
        assert _state_of(installed, "0") == ["STARTING"]
    finally:
        actor.close()


def test_coordinator_without_metrics_exports_nothing(installed):
    actor = CoordinatorActor(heartbeat_timeout_s=30.0, worker_ids=["0"], metrics=False)
    try:
        actor.coordinator.register("0")
        assert _state_of(installed, "0") == []
    finally:
        actor.close()


def test_active_batch_size_follows_every_decode_step(installed, tiny_policy_dir, monkeypatch):
    seen: list[tuple[str, int]] = []
    set_size = TailspecMetrics.set_active_batch_size

    def spy(self, worker, n):
        seen.append((worker, n))
        set_size(self, worker, n)

    monkeypatch.setattr(TailspecMetrics, "set_active_batch_size", spy)
    w = RolloutWorker(3, str(tiny_policy_dir), SAMPLING, max_batch_size=4, metrics=True)
    try:
        assert seen == [("3", 0)]  # the series exists from the start
        reqs = [
            RolloutRequest(f"p{i}-{g}", f"p{i}", [5 + i, 6, 7, 8], 10 * i + g)
            for i in range(2)
            for g in range(3)
        ]
        res = w.rollout(reqs, step=1)
        assert len(res.steps) > 1
        # one value per decode step, as the engine logged it, then 0 once the shard is done
        assert seen[1:] == [("3", s.batch_size) for s in res.steps] + [("3", 0)]
        assert max(n for _, n in seen) == 4  # max_batch_size slots were busy at first
        assert _samples(installed)[("tailspec_active_batch_size", (("worker", "3"),))] == 0
    finally:
        w.close()


def test_choices_by_bucket_uses_the_tables_buckets():
    obs = [
        dict(batch_size=1, arm="off", steps=1),
        dict(batch_size=9, arm="suffix-k8-w1", steps=1),
        dict(batch_size=15, arm="suffix-k8-w1", steps=2),
        dict(batch_size=300, arm="off", steps=5),
    ]
    assert choices_by_bucket(obs, [1, 2, 4, 8, 16, 32, 64, 128, 256]) == {
        "1-1": {"off": 1},
        "8-15": {"suffix-k8-w1": 3},
        "256+": {"off": 5},
    }
    assert bucket_label(8, 16) == "8-15" and bucket_label(256, None) == "256+"


def test_init_series_creates_every_labelled_series_at_zero():
    tm = TailspecMetrics(Metrics(backend="prometheus"))
    table = {
        "arms": {"off": {}, "suffix-k8-w1": {}},
        "buckets": [{"lo": 1, "hi": 8}, {"lo": 8, "hi": None}],
    }
    tm.init_series(["0", "1"], ["suffix", "ngram"], table_arm_buckets(table), ["stale"])
    s = _samples(tm)
    for w in ("0", "1"):
        assert s[("tailspec_bubble_seconds_total", (("worker", w),))] == 0
        assert s[("tailspec_bubble_trained_seconds_total", (("worker", w),))] == 0
    for d in ("suffix", "ngram"):
        assert s[("tailspec_drafted_tokens_total", (("drafter", d),))] == 0
        assert s[("tailspec_accepted_tokens_total", (("drafter", d),))] == 0
        assert s[("tailspec_acceptance_length_count", (("drafter", d),))] == 0
    arms = {k[1] for k in s if k[0] == "tailspec_tuner_arm_selections_total"}
    assert arms == {(("arm", a), ("bucket", b)) for b in ("1-7", "8+") for a in ("off", "suffix-k8-w1")}
    assert all(s[("tailspec_tuner_arm_selections_total", k)] == 0 for k in arms)
    assert s[("tailspec_step_phase_seconds_count", (("phase", "weight_sync"),))] == 0
    assert s[("tailspec_stream_frames_dropped_total", (("reason", "stale"),))] == 0
    # a value already there is kept
    tm.add_bubble("0", 2.5)
    tm.init_series(["0"])
    assert _samples(tm)[("tailspec_bubble_seconds_total", (("worker", "0"),))] == 2.5
