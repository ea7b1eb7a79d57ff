"""benchmarks/policy_update.py in quick mode: the JSON's shape, and all methods minimize the same loss."""

import json

import pytest

from benchmarks import policy_update
from benchmarks.run_all import BENCHMARKS, write_summary


def test_quick_run_writes_json_md_png_and_the_methods_agree_on_the_loss(tmp_path):
    assert "policy_update" in BENCHMARKS
    rc = policy_update.main(["--quick", "--peer", "transformers", "--out-dir", str(tmp_path)])
    assert rc == 0
    d = json.loads((tmp_path / "policy_update.json").read_text())
    assert (tmp_path / "policy_update.png").stat().st_size > 0
    assert d["quick"] is True and d["params"]["samples"] == 2 * 4
    assert d["peer"]["kind"] == "transformers" and d["peer"]["reason"]
    methods = d["methods"]
    assert set(methods) == {"previous", "packed", "peer"}
    tokens = d["samples"]["response_tokens"]
    assert tokens == d["flops"]["response_tokens"] > 0
    for r in methods.values():
        assert len(r["seconds"]) == d["params"]["reps"] == 1
        assert r["tokens_per_s"] == pytest.approx(tokens / r["seconds_median"])
        assert 0 < r["fraction_of_flop_bound"] < 1.5
        assert r["speedup_vs_previous"] == pytest.approx(r["speedup_vs_previous_per_round"][0])
    assert methods["previous"]["speedup_vs_previous"] == 1.0
    # the first pass has ratio 1, so every method's loss is -sum_n A_n |response_n| / tokens: same objective
    losses = [r["first_pass_loss"] for r in methods.values()]
    assert max(losses) - min(losses) < 1e-5
    # the previous layout padded every row to the micro-batch's longest; packing shares the group's prompt
    assert d["samples"]["previous_padded_positions"] > d["flops"]["packed_tokens"]
    assert (
        d["flop_bound_tokens_per_s"] > 0
        and d["bar_new_over_previous"] == methods["packed"]["speedup_vs_previous"]
    )
    md = (tmp_path / "policy_update.md").read_text()
    assert "| packed (new) |" in md and "transformers" in md
    summary = write_summary(tmp_path, {"policy_update": {"status": "ok", "seconds": 1.0}}).read_text()
    assert "GRPO policy update" in summary
