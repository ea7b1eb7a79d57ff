"""A short job exports its metrics live (prometheus_client endpoint outside Ray); the scraped values agree with
metrics.jsonl."""

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families


def _scrape(url: str) -> dict[tuple, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_live_endpoint_matches_metrics_jsonl(train_tiny):
    # a regret budget that pays for exploring from the second step: this short run drafts, so the acceptance
    # histograms below have observations
    run = train_tiny("metrics.port=0", "tuner.bandit.regret_budget=1.0")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    m = _scrape(summary["metrics_endpoint"])
    assert m[("tailspec_rl_step", ())] == rows[-1]["step"]
    assert m[("tailspec_policy_version", ())] == rows[-1]["policy_version"]
    assert m[("tailspec_reward_mean", ())] == pytest.approx(rows[-1]["reward_mean"])
    assert m[("tailspec_response_length_tokens_count", ())] == 2 * 3 * 2
    assert m[("tailspec_response_length_tokens_sum", ())] == sum(r["tokens_generated"] for r in rows)
    rollout = m[("tailspec_step_phase_seconds_sum", (("phase", "rollout"),))]
    assert rollout == pytest.approx(sum(r["rollout_seconds"] for r in rows))
    assert m[("tailspec_step_phase_seconds_count", (("phase", "train"),))] == 2
    idle = sum(v for (name, _), v in m.items() if name == "tailspec_bubble_seconds_total")
    assert idle == pytest.approx(sum(w["idle_seconds"] for r in rows for w in r["workers"]))
    # tuner arms by their real batch-size bucket: per arm the steps of metrics.jsonl's choices
    arms: dict[str, float] = {}
    for (name, labels), v in m.items():
        if name == "tailspec_tuner_arm_selections_total":
            lab = dict(labels)
            assert lab["bucket"] in summary["tuner"]["best_by_bucket"] or v == 0, lab  # a bucket of the table
            arms[lab["arm"]] = arms.get(lab["arm"], 0) + v
    assert {a: v for a, v in arms.items() if v} == summary["tuner"]["choices_total"]
    # acceptance length tau: one observation per verify step and request, by drafter
    verify = sum(r["verify_steps"] for r in rows)
    assert verify > 0
    taus = {}
    for r in rows:
        for d, c in r["drafters"].items():
            for tau, n in c["acceptance_lengths"].items():
                taus.setdefault(d, {})[int(tau)] = taus.get(d, {}).get(int(tau), 0) + n
    assert sum(n for t in taus.values() for n in t.values()) == verify
    assert sum((tau - 1) * n for t in taus.values() for tau, n in t.items()) == sum(
        r["accepted_tokens"] for r in rows
    )
    for d, t in taus.items():
        assert m[("tailspec_acceptance_length_count", (("drafter", d),))] == sum(t.values())
        assert m[("tailspec_acceptance_length_sum", (("drafter", d),))] == sum(
            tau * n for tau, n in t.items()
        )
    # live gauges: each worker in exactly one state; no request decoding after the run
    workers = {str(w["worker"]) for r in rows for w in r["workers"]}
    for w in workers:
        states = [
            k for k, v in m.items() if k[0] == "tailspec_worker_state" and ("worker", w) in k[1] and v == 1
        ]
        assert len(states) == 1, states
        assert m[("tailspec_active_batch_size", (("worker", w),))] == 0
