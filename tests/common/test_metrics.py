"""Metrics facade: prometheus backend scraped over HTTP, tag checks, the spec table, backend choice, Ray."""

from __future__ import annotations

import sys
import types
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.common import metrics as M


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


@pytest.fixture
def tm():
    t = M.TailspecMetrics(backend="prometheus")
    yield t
    t.metrics.stop_http_server()


def test_prometheus_backend_scraped_over_http(tm):
    port = tm.start_http_server(0, addr="127.0.0.1")
    assert isinstance(port, int) and port > 0
    tm.record_spec("suffix", drafted=40, accepted=31, acceptance_lengths=[1, 3, 4.5])
    tm.record_spec("suffix", drafted=10, accepted=0)
    tm.record_spec("learned", drafted=8, accepted=6)
    tm.record_responses([20, 100, 5000])
    tm.set_active_batch_size("rollout-0", 12)
    tm.set_worker_state("rollout-0", "WORKER_STATE_TRAINING")
    tm.record_arm_selection(bucket="8-15", arm="suffix-k8-w1", n=3)
    tm.set_versions(drafter=2)
    tm.record_stream_drop("unauthenticated", 2)
    tm.record_step(
        {
            "step": 5,
            "reward_mean": 0.625,
            "rollout_seconds": 3.0,
            "reward_seconds": 0.02,
            "train_seconds": 1.5,
            "weight_sync_seconds": 0.2,
            "policy_version": 5,
            "format_rate": None,
            "workers": [
                {"worker": "rollout-0", "idle_seconds": 1.25, "trained_seconds": 1.0},
                {"worker": "rollout-1", "idle_seconds": 0.0},
            ],
            "drafters": {"ngram": {"drafted": 7, "accepted": 2, "acceptance_rate": 0.28}},
        }
    )
    s = _scrape(port)
    assert s[("tailspec_accepted_tokens_total", (("drafter", "suffix"),))] == 31
    assert s[("tailspec_drafted_tokens_total", (("drafter", "suffix"),))] == 50
    assert s[("tailspec_accepted_tokens_total", (("drafter", "learned"),))] == 6
    assert s[("tailspec_drafted_tokens_total", (("drafter", "ngram"),))] == 7
    assert s[("tailspec_acceptance_length_count", (("drafter", "suffix"),))] == 3
    assert s[("tailspec_acceptance_length_sum", (("drafter", "suffix"),))] == pytest.approx(8.5)
    assert s[("tailspec_acceptance_length_bucket", (("drafter", "suffix"), ("le", "1.0")))] == 1
    assert s[("tailspec_response_length_tokens_count", ())] == 3
    assert s[("tailspec_response_length_tokens_bucket", (("le", "128.0"),))] == 2
    assert s[("tailspec_active_batch_size", (("worker", "rollout-0"),))] == 12
    assert s[("tailspec_worker_state", (("state", "TRAINING"), ("worker", "rollout-0")))] == 1
    assert s[("tailspec_worker_state", (("state", "IDLE"), ("worker", "rollout-0")))] == 0
    assert s[("tailspec_tuner_arm_selections_total", (("arm", "suffix-k8-w1"), ("bucket", "8-15")))] == 3
    assert s[("tailspec_drafter_version", ())] == 2
    assert s[("tailspec_policy_version", ())] == 5
    assert s[("tailspec_rl_step", ())] == 5
    assert s[("tailspec_reward_mean", ())] == 0.625
    assert s[("tailspec_bubble_seconds_total", (("worker", "rollout-0"),))] == 1.25
    assert s[("tailspec_bubble_trained_seconds_total", (("worker", "rollout-0"),))] == 1.0
    assert s[("tailspec_step_phase_seconds_count", (("phase", "train"),))] == 1
    assert s[("tailspec_step_phase_seconds_sum", (("phase", "rollout"),))] == 3.0
    assert s[("tailspec_stream_frames_dropped_total", (("reason", "unauthenticated"),))] == 2
    # every documented metric is exported under its documented name
    families = {name for name, _ in s}
    for spec in M.METRICS:
        assert spec.name + ("_count" if spec.type == "histogram" else "") in families, spec.name


def test_tags_are_checked_and_counters_monotonic():
    m = M.Metrics(backend="prometheus", prefix="t")
    c = m.counter("things", "Things", unit="things", tag_keys=("kind",))
    assert c.name == "t_things"
    with pytest.raises(ValueError, match="missing"):
        c.inc(1, {})
    with pytest.raises(ValueError, match="unknown"):
        c.inc(1, {"kind": "a", "other": "b"})
    with pytest.raises(ValueError):
        c.inc(-1, {"kind": "a"})
    c.inc(0, {"kind": "a"})  # no-op
    c.inc(2, {"kind": 7})  # values become strings
    assert b't_things_total{kind="7"} 2.0' in m.exposition()
    assert m.counter("things_total", tag_keys=("kind",)) is c  # cached; _total optional
    with pytest.raises(ValueError, match="already exists"):
        m.gauge("things")
    with pytest.raises(ValueError, match="boundaries"):
        m.histogram("h", boundaries=[2, 1])
    with pytest.raises(ValueError, match="boundaries"):
        m.histogram("h2")
    with pytest.raises(ValueError):
        M.Metrics(backend="statsd")
    with pytest.raises(ValueError, match="unknown worker state"):
        M.TailspecMetrics(M.Metrics(backend="prometheus")).set_worker_state("w", "NAPPING")


def test_two_facades_do_not_collide():
    a, b = M.TailspecMetrics(backend="prometheus"), M.TailspecMetrics(backend="prometheus")
    a.set_versions(policy=1)
    b.set_versions(policy=2)
    assert b"tailspec_policy_version 1.0" in a.metrics.exposition()
    assert b"tailspec_policy_version 2.0" in b.metrics.exposition()


def test_auto_backend_follows_ray(monkeypatch):
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert not M.ray_active() and M.Metrics().backend == "prometheus"
    fake.is_initialized = lambda: True
    assert M.ray_active()
    monkeypatch.delitem(sys.modules, "ray")
    assert not M.ray_active()


def test_spec_table_and_docs():
    names = {s.name for s in M.METRICS}
    required = {
        "tailspec_accepted_tokens_total": ("counter", ("drafter",)),
        "tailspec_drafted_tokens_total": ("counter", ("drafter",)),
        "tailspec_acceptance_length": ("histogram", None),
        "tailspec_active_batch_size": ("gauge", None),
        "tailspec_response_length_tokens": ("histogram", None),
        "tailspec_worker_state": ("gauge", ("worker", "state")),
        "tailspec_bubble_seconds_total": ("counter", ("worker",)),
        "tailspec_bubble_trained_seconds_total": ("counter", ("worker",)),
        "tailspec_drafter_version": ("gauge", None),
        "tailspec_policy_version": ("gauge", None),
        "tailspec_tuner_arm_selections_total": ("counter", ("bucket", "arm")),
        "tailspec_step_phase_seconds": ("histogram", ("phase",)),
        "tailspec_rl_step": ("gauge", None),
        "tailspec_reward_mean": ("gauge", None),
    }
    assert set(required) <= names
    by_name = {s.name: s for s in M.METRICS}
    for name, (kind, labels) in required.items():
        spec = by_name[name]
        assert spec.type == kind and spec.unit and spec.description
        assert (spec.type == "counter") == name.endswith("_total")
        assert (spec.boundaries is not None) == (kind == "histogram")
        if labels is not None:
            assert spec.labels == labels
    md = M.docs_table()
    assert md.startswith("| Metric | Type | Unit | Labels | Description |")
    for name in required:
        assert f"`{name}`" in md


def test_ray_backend(ray_cluster):
    ray = ray_cluster

    @ray.remote
    def record() -> str:
        from services.common.metrics import TailspecMetrics

        t = TailspecMetrics()  # auto: inside a Ray worker
        t.record_spec("suffix", 4, 3, [2.0, 4.0])
        t.set_worker_state("w0", "IDLE")
        t.record_step({"step": 1, "reward_mean": 0.5, "rollout_seconds": 1.0})
        assert t.metrics.start_http_server(0) is None  # Ray's metrics agent exports
        return t.backend

    assert ray.get(record.remote()) == "ray"
    assert M.Metrics().backend == "ray"  # the driver, with Ray initialized
