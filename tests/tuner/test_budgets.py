"""Length-aware budgets: history, long / medium / short classes, quota allocation, config errors."""

import pytest

from services.tuner.arms import TunerConfigError
from services.tuner.budgets import BudgetConfig, LengthBudgets, LengthHistory


def history_with(lengths_by_problem, **cfg):
    h = LengthHistory(BudgetConfig(**cfg))
    for pid, lengths in lengths_by_problem.items():
        for n in lengths:
            h.record(pid, n)
    return h


def test_history_predicts_from_the_last_lengths():
    h = history_with({"p": [100, 300, 200]}, history=2)
    assert h.predicted("p") == pytest.approx(0.5 * 250 + 0.5 * 300)  # mean and max of the last 2
    assert h.predicted("unknown") is None
    with pytest.raises(ValueError):
        h.record("p", -1)


def test_classify_by_quantiles():
    h = history_with({f"p{i}": [100 * (i + 1)] for i in range(12)}, max_weight=0.0, min_problems=8)
    long_t, short_t = h.thresholds()
    assert short_t == pytest.approx(375.0) and long_t == pytest.approx(925.0)
    classes = [h.classify(f"p{i}") for i in range(12)]
    assert classes == ["short"] * 3 + ["medium"] * 6 + ["long"] * 3
    assert h.classify("never-seen") == "medium"
    assert h.classify("p0", generated=950) == "long"  # already generated past the long threshold


def test_max_matters_for_a_problem_that_sometimes_runs_long():
    lengths = {f"p{i}": [200 + 10 * i, 210 + 10 * i] for i in range(10)}
    lengths["spiky"] = [50, 50, 50, 600]
    h = history_with(lengths, max_weight=0.5)
    assert sum(lengths["spiky"]) / 4 < sum(lengths["p0"]) / 2
    assert h.classify("spiky") == "long"
    assert history_with(lengths, max_weight=0.0).classify("spiky") == "short"


def test_too_few_problems_or_equal_lengths_are_medium():
    h = history_with({"a": [10], "b": [1000]}, min_problems=8)
    assert h.classify("a") == h.classify("b") == "medium"
    same = history_with({f"p{i}": [500] for i in range(10)})
    assert {same.classify(f"p{i}") for i in range(10)} == {"medium"}


def test_fixed_thresholds():
    h = history_with({"a": [50], "b": [500], "c": [5000]}, long_threshold=2000, short_threshold=100)
    assert [h.classify(p) for p in "abc"] == ["short", "medium", "long"]
    assert h.classify("x", generated=2500) == "long"


def test_history_forgets_the_problem_seen_longest_ago():
    h = history_with({"a": [1, 2], "b": [3]}, max_problems=2)
    h.record("a", 5)  # a is now the most recent
    h.record("c", 7)  # evicts b
    assert h.predicted("b") is None and h.predicted("a") is not None and h.predicted("c") == 7


def _budgets(**cfg):
    lengths = {f"long{i}": [4000] for i in range(3)}
    lengths.update({f"mid{i}": [1000] for i in range(4)})
    lengths.update({f"short{i}": [100] for i in range(3)})
    cfg.setdefault("long", 16)
    cfg.setdefault("medium", 8)
    cfg.setdefault("short", 4)
    h = history_with(lengths, **cfg)
    return LengthBudgets(h.cfg, h)


def test_allocate_class_budgets_when_quota_is_ample():
    lb = _budgets(step_quota=1000)
    reqs = [("r1", "short0", 12), ("r2", "long0", 12), ("r3", "mid0", 12), ("r4", "nobody", None)]
    assert lb.allocate(reqs) == {"r1": 4, "r2": 12, "r3": 8, "r4": 8}  # min(requested, class budget)
    assert list(lb.allocate(reqs)) == ["r1", "r2", "r3", "r4"]  # input order kept
    assert lb.allocate([("r", "long1", None)]) == {"r": 16}
    assert lb.allocate([("r", "long1", 0)]) == {"r": 0}  # off asks for nothing


def test_allocate_quota_goes_to_long_requests_first():
    lb = _budgets()
    reqs = [("s", "short0", None), ("m1", "mid0", None), ("l1", "long0", None), ("m2", "mid1", None)]
    reqs.append(("l2", "long1", None))
    assert lb.allocate(reqs, quota=40) == {"s": 0, "m1": 8, "l1": 16, "m2": 0, "l2": 16}
    assert lb.allocate(reqs, quota=36) == {"s": 0, "m1": 4, "l1": 16, "m2": 0, "l2": 16}  # partial draft
    assert lb.allocate(reqs, quota=20) == {"s": 0, "m1": 0, "l1": 16, "m2": 0, "l2": 4}
    assert lb.allocate(reqs, quota=0) == dict.fromkeys(["s", "m1", "l1", "m2", "l2"], 0)
    full = lb.allocate(reqs, quota=10_000)
    assert sum(full.values()) == 16 + 16 + 8 + 8 + 4


def test_allocate_within_class_longest_first_and_online_length():
    lb = _budgets(long_threshold=3000, short_threshold=200)
    lb.history.record("long2", 9000)  # predicted longer than long0
    reqs = [("a", "long0", None), ("b", "long2", None), ("c", "mid0", None, 5000)]
    # c has already generated 5000 tokens: long. Longest first: b (predicted 7750), c (5000), a (4000)
    assert lb.history.classify("mid0", 5000) == "long"
    assert lb.allocate(reqs, quota=20) == {"a": 0, "b": 16, "c": 4}


def test_allocate_rejects_bad_requests():
    lb = _budgets()
    with pytest.raises(ValueError, match="duplicate request_id 'a'"):
        lb.allocate([("a", "p", 4), ("a", "q", 4)])
    with pytest.raises(ValueError, match="requested_budget"):
        lb.allocate([("a", "p", -4)])
    with pytest.raises(ValueError, match="expected"):
        lb.allocate([("a", "p")])
    with pytest.raises(ValueError, match="quota"):
        lb.allocate([("a", "p", 4)], quota=-1)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"long": 0}, "tuner.budgets.long: must be an integer >= 1, got 0"),
        ({"medium": -8}, "tuner.budgets.medium"),
        ({"short": 2.5}, "tuner.budgets.short"),
        ({"short": True}, "tuner.budgets.short"),
        ({"step_quota": 0}, "tuner.budgets.step_quota: must be an integer >= 1"),
        ({"history": 0}, "tuner.budgets.history"),
        ({"max_weight": 1.5}, "max_weight"),
        ({"long_quantile": 1.0}, "long_quantile"),
        ({"short_quantile": 0.8, "long_quantile": 0.7}, "short_quantile (0.8) must be below long_quantile"),
        ({"long_threshold": 0}, "long_threshold"),
        ({"long_threshold": 100, "short_threshold": 100}, "short_threshold (100) must be below"),
    ],
)
def test_budget_config_errors(kwargs, fragment):
    with pytest.raises(TunerConfigError) as ei:
        BudgetConfig(**kwargs)
    assert fragment in str(ei.value)


def test_budget_config_from_dict():
    cfg, dflt = BudgetConfig.from_dict({"long": 24, "step_quota": 256}, source="run.yaml"), BudgetConfig()
    assert (cfg.long, cfg.medium, cfg.short, cfg.step_quota) == (24, dflt.medium, dflt.short, 256)
    with pytest.raises(TunerConfigError, match=r"run.yaml: tuner.budgets: unknown key\(s\) \['quota'\]"):
        BudgetConfig.from_dict({"quota": 5}, source="run.yaml")
    with pytest.raises(TunerConfigError, match=r"^run.yaml: tuner.budgets.long"):
        BudgetConfig.from_dict({"long": -1}, source="run.yaml")
