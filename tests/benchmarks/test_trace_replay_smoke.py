"""Smoke test of ``benchmarks.trace_replay`` on the tiny shape (1 problem at max batch 1, 2 at 8, two fixed arms,
two warm-ups of the adaptive tuner).

Checks the JSON schema and headline keys, that every speedup is computed from the measured times, and, through
the public API, that every replayed output is its trace: the recorded response's ids, then EOS, decoding back
to the recorded text. No timing assertions (speed is the benchmark's business).
"""

from __future__ import annotations

import json
import statistics

import pytest

from benchmarks.trace_replay import report, workload
from benchmarks.trace_replay.__main__ import main
from benchmarks.trace_replay.runner import (
    ADAPTIVE,
    PLAIN,
    PLAIN_AGAIN,
    ReplayBench,
    ReplayRun,
    adaptive_index,
    adaptive_name,
    all_configs,
)
from services.rollout_actor.shapes import build_model, load_tokenizer, shape_config

ARMS = ["suffix-k8", "ngram-k3"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace_replay")
    argv = ["--shapes", "tiny", "--problems", "1,2", "--batches", "1,8", "--rounds", "1"]
    argv += ["--arms", ",".join(ARMS), "--warm-problems", "1", "--warm-ups", "2", "--out-dir", str(out)]
    return main(argv), out


def test_outputs_written(result):
    res, out = result
    on_disk = json.loads((out / "trace_replay.json").read_text())
    assert on_disk["headline"] == json.loads(json.dumps(res["headline"]))
    assert (out / "trace_replay.png").stat().st_size > 0
    md = (out / "trace_replay.md").read_text()
    assert "| shape | batch | best fixed arm |" in md and "suffix-k8" in md
    (out / "trace_replay.md").unlink()  # rebuilt from the JSON alone, as after a GPU run
    report.main([str(out / "trace_replay.json")])
    assert (out / "trace_replay.md").read_text() == md


def test_each_batch_size_measures_its_own_number_of_problems(result):
    res, _ = result
    assert res["workload"]["problems"] == {1: 1, 8: 2}
    group = res["workload"]["group"]
    assert [blk["workload"]["requests"] for blk in res["results"]] == [group, 2 * group]
    with pytest.raises(SystemExit):
        main(["--batches", "8,32", "--problems", "1,2,3"])


def test_headline_schema(result):
    res, _ = result
    assert [(h["shape"], h["batch"]) for h in res["headline"]] == [("tiny", 1), ("tiny", 8)]
    for h in res["headline"]:
        assert set(report.HEADLINE_KEYS) <= set(h)
        assert h["device"] == "cpu"
        assert h["best_fixed_arm"] in ARMS
        assert h["tau_best"] >= 1.0
        for key in (
            "long_tail_speedup_best_fixed",
            "long_tail_speedup_adaptive",
            "makespan_speedup_adaptive",
        ):
            assert h[key] > 0
        assert h["exact_fraction"] == 1.0


def test_the_tuner_table_is_kept_per_bucket(result):
    """The adaptive policy's table after the warm-up and after the rounds: per bucket its best arm and each arm's
    throughput over its records, the buckets in order and covering the batch sizes from 1."""
    res, _ = result
    for blk in res["results"]:
        for when in ("after_warm_up", "after_rounds"):
            rows = blk["tuner"][when]
            assert rows[0]["lo"] == 1 and all(a["hi"] == b["lo"] for a, b in zip(rows, rows[1:]))
            for row in rows:
                assert isinstance(row["best"], str) and row["best"]  # may be borrowed from a neighbour bucket
                for rate, records in row["rates"].values():
                    assert records >= 0 and (rate is None or rate > 0)
        played = [r["rates"] for r in blk["tuner"]["after_rounds"] if r["lo"] <= blk["batch"]]
        assert any(played)  # the rounds left records in the buckets they reached


def test_speedups_from_measured_times(result):
    res, _ = result
    for blk in res["results"]:
        runs = {r["config"]: r for r in blk["runs"]}
        assert set(runs) == {PLAIN, PLAIN_AGAIN, *ARMS, ADAPTIVE, "adaptive-2"}
        cs = blk["summary"]["configs"]
        plain = runs[PLAIN]
        for c, r in runs.items():
            assert r["exact"] == r["requests"] == blk["workload"]["requests"]
            assert r["tokens"] == plain["tokens"]  # replay: every configuration decodes the same tokens
            assert cs[c]["makespan_speedup"] == pytest.approx(plain["makespan_s"] / r["makespan_s"])
            # equal work: every run's seconds for the rollout's last N tokens, N = plain's long-tail tokens
            assert r["longtail_tokens"] == plain["longtail_tokens"] > 0
            assert 0 < r["longtail_s"] <= r["makespan_s"] + r["capture_s"]
            assert cs[c]["longtail_speedup"] == pytest.approx(plain["longtail_s"] / r["longtail_s"])
            if r["verify_steps"]:
                assert r["tau"] == pytest.approx(1 + r["accepted"] / r["verify_steps"])
                acc, dra = r["accepted_by_position"], r["drafted_by_position"]
                assert acc == sorted(acc, reverse=True)  # depth k + 1 is accepted only after depth k
                assert all(a <= d for a, d in zip(acc, dra)) and sum(acc) == r["accepted"]
                rates = cs[c]["acceptance_by_position"]
                assert rates == [pytest.approx(a / d) for a, d in zip(acc, dra)]
        assert runs[PLAIN]["verify_steps"] == 0 and cs[PLAIN]["tau"] is None
        for (
            c,
            r,
        ) in runs.items():  # a long-tail step's milliseconds: drafting + the forward + the engine's work
            ms = cs[c]["longtail_step_ms"]
            assert ms["step"] == pytest.approx(1e3 * r["phase_s"] / r["phase_steps"])
            assert ms["forward"] == pytest.approx(1e3 * r["phase_forward_s"] / r["phase_steps"])
            assert 0 < r["phase_forward_s"] < r["phase_s"] and 0 <= r["phase_draft_s"] < r["phase_s"]
            assert ms["draft"] + ms["forward"] + ms["rest"] == pytest.approx(ms["step"]) and ms["rest"] > 0
        head = next(h for h in res["headline"] if h["batch"] == blk["batch"])
        best = head["best_fixed_arm"]
        assert head["long_tail_speedup_best_fixed"] == max(cs[a]["longtail_speedup"] for a in ARMS)
        assert head["tau_best"] == cs[best]["tau"]
        aa = blk["summary"]["aa"]["makespan_ratios"]
        assert aa == [pytest.approx(plain["makespan_s"] / runs[PLAIN_AGAIN]["makespan_s"])]
    # at max batch 1 every decode step is in the long-tail phase, and the long tail is every token
    b1 = next(b for b in res["results"] if b["batch"] == 1)
    for r in b1["runs"]:
        assert r["phase_steps"] == r["steps"] and r["longtail_tokens"] == r["tokens"] - r["requests"]


def test_throughput_by_batch_size_bucket_adds_up_to_each_run(result):
    res, out = result
    md = (out / "trace_replay.md").read_text()
    for blk in res["results"]:
        cs = blk["summary"]["configs"]
        for r in blk["runs"]:
            rows = r["by_batch"]
            assert sum(x[0] for x in rows.values()) == r["steps"]  # every step in one bucket
            # committed tokens: the whole rollout but each request's first token (sampled at prefill)
            assert sum(x[1] for x in rows.values()) == r["tokens"] - r["requests"]
            assert all(sum(x[3].values()) == x[0] for x in rows.values())
            assert set(rows) <= set(cs[PLAIN]["by_batch"])  # every run passes the batch sizes plain does
            for label, (steps, tokens, seconds, _) in rows.items():
                row = cs[r["config"]]["by_batch"][label]  # one round: the run's own
                assert row["steps"] == steps
                assert row["tokens_per_s"] == pytest.approx(tokens / seconds)
                plain = cs[PLAIN]["by_batch"][label]["tokens_per_s"]
                assert row["vs_plain"] == pytest.approx(row["tokens_per_s"] / plain)
        assert set(cs[PLAIN]["by_batch"]["1"]["strategies"]) == {"off"}
        labels = list(cs[PLAIN]["by_batch"])
        assert "| config | " + " | ".join(labels) + " |" in md
    # max batch 8: every batch size from 8 down to 1 occurs as the group's responses finish
    b8 = next(b for b in res["results"] if b["batch"] == 8)
    assert list(b8["summary"]["configs"][PLAIN]["by_batch"]) == ["1", "2-3", "4-7", "8-15"]
    assert "| adaptive: most played |" in md and "| adaptive-2: most played |" in md


def test_the_adaptive_figures_are_the_mean_over_the_warm_ups(result):
    res, out = result
    md = (out / "trace_replay.md").read_text()
    for blk in res["results"]:
        cs = blk["summary"]["configs"]
        head = next(h for h in res["headline"] if h["batch"] == blk["batch"])
        ups = [cs[ADAPTIVE], cs["adaptive-2"]]
        assert head["adaptive_warm_ups"] == [[u["longtail_speedup"], u["makespan_speedup"]] for u in ups]
        assert head["long_tail_speedup_adaptive"] == pytest.approx(
            statistics.fmean(u["longtail_speedup"] for u in ups)
        )
        assert head["makespan_speedup_adaptive"] == pytest.approx(
            statistics.fmean(u["makespan_speedup"] for u in ups)
        )
        lo, hi = head["long_tail_speedup_range_adaptive"]
        assert lo == min(u["longtail_speedup"] for u in ups) and hi == max(u["longtail_speedup"] for u in ups)
        vs = head["adaptive_vs_best_fixed"]
        assert vs["long_tail"] == pytest.approx(
            head["long_tail_speedup_adaptive"] / head["long_tail_speedup_best_fixed"]
        )
        best_makespan = max(cs[a]["makespan_speedup"] for a in ARMS)
        assert vs["makespan"] == pytest.approx(head["makespan_speedup_adaptive"] / best_makespan)
        assert f"{vs['long_tail']:.3f}, {vs['makespan']:.3f} (long tail per warm-up: " in md
    assert "adaptive = the mean over 2 tuners" in md


def test_each_warm_up_has_its_own_tuner():
    assert [adaptive_name(k) for k in range(3)] == [ADAPTIVE, "adaptive-2", "adaptive-3"]
    assert [adaptive_index(c) for c in (ADAPTIVE, "adaptive-2", "adaptive-10")] == [0, 1, 9]
    assert [adaptive_index(c) for c in (PLAIN, "adaptive-1", "adaptive-x", "suffix-k8")] == [None] * 4
    assert all_configs(["suffix-k8"], 2) == [PLAIN, PLAIN_AGAIN, "suffix-k8", ADAPTIVE, "adaptive-2"]
    with pytest.raises(ValueError, match="warm_ups"):
        all_configs(["suffix-k8"], 0)
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=1), load_tokenizer("tiny"), cfg.vocab_size, [0])
    bench = ReplayBench(build_model("tiny"), problems, batch=8, seed=5)
    with pytest.raises(RuntimeError, match="warm"):
        bench.run(ADAPTIVE, 0)
    warm = bench.warm(0, warm_ups=2)
    assert warm["warm_ups"] == 2 and len({id(t) for t in bench.tuners}) == 2
    assert [a.seed for a in bench.adaptives] == [5, 6]
    with pytest.raises(RuntimeError, match="warm_ups=3"):
        bench.run("adaptive-3", 0)
    before = [t.bandit.steps for t in bench.tuners]
    runs = bench.run_lockstep([ADAPTIVE, "adaptive-2"], 0)
    assert all(r.exact == r.requests and r.strategies for r in runs)
    # each run's decode steps went into its own tuner, and only there
    assert [t.bandit.steps - b for t, b in zip(bench.tuners, before)] == [r.steps for r in runs]


def test_replay_equals_the_trace():
    cfg = shape_config("tiny")
    tok = load_tokenizer("tiny")
    rows = workload.load_rows(problems=2)
    problems = workload.tokenize(rows, tok, cfg.vocab_size, cfg.eos_ids())
    bench = ReplayBench(build_model("tiny"), problems, batch=8)
    bench.warm(1)
    texts = {f"math-{row['idx']}-e1-g{g}": row["responses"][4 + g] for row in rows for g in range(4)}
    for config in (PLAIN, "suffix-k8", "suffix-tree-k16w2d8"):
        reqs, outs = bench.outputs(config)
        assert [o.request_id for o in outs] == [r.request_id for r in reqs] and len(outs) == 8
        for o in outs:
            assert o.finish_reason == "eos" and o.token_ids[-1] in cfg.eos_ids()
            assert tok.decode(o.token_ids[:-1]) == texts[o.request_id], (config, o.request_id)
        if config != PLAIN:
            assert sum(o.spec.accepted for o in outs) > 0  # the history epoch makes drafts land
    lens = [len(r) for p in problems for r in p.epoch(workload.MEASURED_EPOCH)]
    assert statistics.fmean(lens) > 50  # real reasoning responses, not a stub


def test_a_history_from_the_trace_drafts_as_a_decoded_history_does():
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=2), load_tokenizer("tiny"), cfg.vocab_size, [0])
    runs = {}
    for decode in (True, False):
        bench = ReplayBench(build_model("tiny"), problems, batch=8)
        warm = bench.warm(0, decode_history=decode)
        assert warm["history_decoded"] is decode and (warm["exact"] == 8 if decode else warm["exact"] is None)
        runs[decode] = (bench.history_lengths, bench.run("suffix-k8", 0))
    (lens_d, run_d), (lens_t, run_t) = runs[True], runs[False]
    assert lens_d == lens_t
    assert run_t.accepted > 0 and run_t.exact == run_t.requests
    assert (run_t.drafted, run_t.accepted, run_t.verify_steps) == (
        run_d.drafted,
        run_d.accepted,
        run_d.verify_steps,
    )


def test_workload_epochs_and_requests():
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=3), load_tokenizer("tiny"), cfg.vocab_size, [0])
    reqs = workload.requests(problems, workload.MEASURED_EPOCH)
    assert len(reqs) == 3 * workload.GROUP
    assert [r.problem_id for r in reqs[: workload.GROUP]] == [problems[0].problem_id] * workload.GROUP
    for r, ref in zip(reqs, [x for p in problems for x in p.responses[4:8]]):
        assert r.reference == ref and r.params.max_new_tokens == len(ref) + 1
    hist = workload.requests(problems, workload.HISTORY_EPOCH)
    assert [r.reference for r in hist[:4]] == problems[0].responses[:4]
    with pytest.raises(ValueError, match="epoch 2"):
        problems[0].epoch(2)
    with pytest.raises(ValueError, match="vocabulary"):
        workload.tokenize(workload.load_rows(problems=1), load_tokenizer("qwen2.5-7b"), 2048, [0])


def test_a_drafting_run_before_any_plain_one_measures_plain_decodings_long_tail():
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=1), load_tokenizer("tiny"), cfg.vocab_size, [0])
    bench = ReplayBench(build_model("tiny"), problems, batch=8)
    bench.warm(0)
    first = bench.run("suffix-k8", 0)
    plain = bench.run(PLAIN, 0)
    assert first.longtail_tokens == plain.longtail_tokens == plain.tokens - plain.requests  # all in the tail
    assert 0 < first.longtail_s <= first.makespan_s + first.capture_s


def test_forwards_that_a_full_graph_budget_sends_eager_are_counted():
    from services.rollout_actor.engine import Engine
    from tests.rollout_actor.test_cuda_graphs import FakeGraphBackend

    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=1), load_tokenizer("tiny"), cfg.vocab_size, [0])
    model = build_model("tiny")
    bench = ReplayBench(model, problems, batch=8)
    assert bench.run(PLAIN, 0).eager_forwards is None  # no graphs on CPU
    counts = {}
    for budget in (10**9, 250):  # room for every graph; for two (each charged 100 bytes + its inputs)
        bench.engine = Engine(
            model,
            max_batch_size=8,
            max_seq_len=bench.engine.max_seq_len,
            cuda_graphs=True,
            graph_backend=FakeGraphBackend(capture_bytes=100),
            cuda_graph_memory_bytes=budget,
        )
        counts[budget] = bench.run("suffix-k8", 0).eager_forwards
    assert counts[10**9] == 0 < counts[250]


def test_a_lock_step_round_decodes_what_each_configuration_decodes_alone():
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=1), load_tokenizer("tiny"), cfg.vocab_size, [0])
    bench = ReplayBench(build_model("tiny"), problems, batch=8)
    bench.warm(0)
    configs = [PLAIN, "suffix-k8", ADAPTIVE]
    alone = {c: bench.run(c, 0) for c in configs}
    side_by_side = bench.run_lockstep(configs, 1)
    assert [r.config for r in side_by_side] == configs
    for r in side_by_side:
        a = alone[r.config]
        assert r.exact == r.requests == a.requests
        assert (r.tokens, r.longtail_tokens) == (a.tokens, a.longtail_tokens)
        assert 0 < r.phase_s <= r.makespan_s and 0 < r.longtail_s <= r.makespan_s
        if r.config != ADAPTIVE:  # same drafter state, same schedule (the tuner learns between runs)
            assert (r.steps, r.accepted) == (a.steps, a.accepted)
    assert side_by_side[2].strategies  # the adaptive run's choices, drained
    with pytest.raises(ValueError, match="distinct"):
        bench.run_lockstep([PLAIN, PLAIN], 2)


def test_a_lock_step_round_without_plain_takes_the_long_tail_from_an_untimed_plain_run():
    cfg = shape_config("tiny")
    problems = workload.tokenize(workload.load_rows(problems=1), load_tokenizer("tiny"), cfg.vocab_size, [0])
    bench = ReplayBench(build_model("tiny"), problems, batch=8)
    bench.warm(0)
    (k8,) = bench.run_lockstep(["suffix-k8"], 0)
    plain = bench.run(PLAIN, 0)
    assert k8.longtail_tokens == plain.longtail_tokens == plain.tokens - plain.requests  # all in the tail
    assert 0 < k8.longtail_s <= k8.makespan_s


def test_speedup_range_over_rounds(result, tmp_path):
    """Two rounds of the same runs with other long-tail seconds: the median and the range of their ratios."""
    res, _ = result
    blk = next(b for b in res["results"] if b["batch"] == 8)
    rounds = []
    for rep, scale in ((0, 1.0), (1, 1.5)):  # the second round's suffix-k8 long tail 1.5x slower
        for r in blk["runs"]:
            d = {k: v for k, v in r.items() if k != "tau"} | {"rep": rep}
            if d["config"] == "suffix-k8":
                d["longtail_s"] *= scale
            rounds.append(ReplayRun(**d))
    summary = report.summarize(rounds, res["settings"]["configs"])
    one = blk["runs"]
    plain = next(r for r in one if r["config"] == PLAIN)["longtail_s"]
    k8 = next(r for r in one if r["config"] == "suffix-k8")["longtail_s"]
    lo, hi = plain / (1.5 * k8), plain / k8
    assert summary["configs"]["suffix-k8"]["longtail_speedup_range"] == [pytest.approx(lo), pytest.approx(hi)]
    assert summary["configs"]["suffix-k8"]["longtail_speedup"] == pytest.approx((lo + hi) / 2)
    assert summary["configs"][PLAIN]["longtail_speedup_range"] == [1.0, 1.0]
    md = report.write_markdown({**res, "results": [{**blk, "summary": summary}]}, tmp_path / "r.md")
    assert f"{(lo + hi) / 2:.2f} ({lo:.2f}-{hi:.2f})" in md
