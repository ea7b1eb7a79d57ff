"""A short job exports its metrics live (prometheus_client endpoint outside Ray); the scraped values agree with
metrics.jsonl."""

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.pipeline.cli import main


def _scrape(url: str) -> dict[tuple, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_live_endpoint_matches_metrics_jsonl(tmp_path, tiny_policy_dir):
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--run-dir",
            str(run),
            f"model.path={tiny_policy_dir}",
            "trainer.steps=2",
            "trainer.prompts_per_step=3",
            "trainer.group_size=2",
            "rollout.max_new_tokens=12",
            "ray.use_ray=false",
            "metrics.port=0",
        ]
    )
    assert rc == 0
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
    chosen = sum(v for (name, _), v in m.items() if name == "tailspec_tuner_arm_selections_total")
    assert chosen == sum(sum(r["tuner"]["choices"].values()) for r in rows)
