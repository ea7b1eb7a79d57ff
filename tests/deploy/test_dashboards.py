"""The Grafana dashboards (services/common/dashboards.py): committed JSON == a fresh render, every PromQL
expression selects only metrics the code exports, and every file is a Grafana dashboard model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from services.common import dashboards as dash

REPO = Path(__file__).resolve().parents[2]
RENDERED = [REPO / "deploy" / "grafana", REPO / "helm" / "tailspec" / "dashboards"]
UIDS = ["tailspec-bubbles", "tailspec-health", "tailspec-longtail", "tailspec-speculation"]

# The metrics the code exports (name -> type), as specified for services/common/metrics.py. Used when that
# module (its METRICS table) is not importable; when it is, METRICS is the source of truth.
KNOWN_METRICS = {
    "tailspec_accepted_tokens_total": "counter",
    "tailspec_drafted_tokens_total": "counter",
    "tailspec_acceptance_length": "histogram",
    "tailspec_active_batch_size": "gauge",
    "tailspec_response_length_tokens": "histogram",
    "tailspec_worker_state": "gauge",
    "tailspec_bubble_seconds_total": "counter",
    "tailspec_bubble_trained_seconds_total": "counter",
    "tailspec_drafter_version": "gauge",
    "tailspec_policy_version": "gauge",
    "tailspec_tuner_arm_selections_total": "counter",
    "tailspec_step_phase_seconds": "histogram",
    "tailspec_rl_step": "gauge",
    "tailspec_reward_mean": "gauge",
}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")

PROMQL_WORDS = {
    # functions and aggregations the dashboards may use, and PromQL keywords / Grafana macros
    "rate", "irate", "increase", "changes", "deriv", "delta", "histogram_quantile", "sum", "max", "min", "avg",
    "count", "vector", "by", "without", "ignoring", "on", "group_left", "group_right", "or", "and", "unless",
    "time", "timestamp", "clamp_min", "clamp_max", "abs", "label_replace",
    "__rate_interval", "__interval", "__range",
}  # fmt: skip


def _exported() -> dict[str, str]:
    """Exported metric name -> type: services.common.metrics.METRICS if importable, else KNOWN_METRICS."""
    try:
        from services.common.metrics import METRICS  # the code's own table
    except ImportError:
        return dict(KNOWN_METRICS)
    out = {s.name: s.type for s in METRICS}
    # a counter declared without its exposed _total suffix (prometheus_client and Ray both add it)
    out.update({n + "_total": t for n, t in list(out.items()) if t == "counter" and not n.endswith("_total")})
    return out


def test_known_metrics_match_the_code():
    """The fallback list above is the same as the code's METRICS table (when that exists)."""
    pytest.importorskip("services.common.metrics")
    exported = _exported()
    assert {n: exported.get(n) for n in KNOWN_METRICS} == KNOWN_METRICS


def _strip_for_identifiers(expr: str) -> str:
    s = re.sub(r"\{[^}]*\}", " ", expr)  # selectors, incl. the __name__ regex
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range windows
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", r"\1 ", s)  # label lists
    s = re.sub(r"\d+(\.\d+)?", " ", s)
    return s


@pytest.mark.parametrize("out_dir", RENDERED, ids=["deploy-grafana", "helm-chart"])
def test_committed_json_is_fresh_render(out_dir):
    fresh = {f"{d.uid}.json": dash.dump(d) for d in dash.all_dashboards()}
    committed = {p.name: p.read_text() for p in out_dir.glob("*.json")}
    assert committed == fresh, "stale dashboards: run `python -m services.common.dashboards`"


def test_render_all_writes_every_dashboard(tmp_path):
    paths = dash.render_all(tmp_path / "out")
    assert sorted(p.stem for p in paths) == UIDS
    assert dash.main([str(tmp_path / "cli")]) == 0
    assert sorted(p.stem for p in (tmp_path / "cli").glob("*.json")) == UIDS


def test_every_expr_selects_only_exported_metrics():
    exported = _exported()
    exprs = dash.all_exprs()
    assert len(exprs) >= 30
    for expr in exprs:
        names = dash.metric_names_in(expr)
        assert names, f"expression selects no tailspec metric: {expr}"
        for name in names:
            base = next((name[: -len(s)] for s in HIST_SUFFIXES if name.endswith(s)), None)
            assert name in exported or base in exported, f"{name!r} is not an exported metric ({expr})"
            if name not in exported:
                assert exported[base] == "histogram", f"{name}: {base} is a {exported[base]}, not a histogram"
        # no metric is referenced any other way than through m() (a bare name would escape the check above)
        leftovers = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", _strip_for_identifiers(expr)))
        assert leftovers <= PROMQL_WORDS, f"unexpected identifiers {leftovers - PROMQL_WORDS} in {expr}"
        # the name regex tolerates Ray's prefix and nothing else
        for sel in re.findall(r'__name__=~"([^"]*)"', expr):
            assert sel.startswith("(?:ray_)?tailspec_"), sel


def test_every_exported_metric_is_on_a_dashboard():
    used = dash.metric_names_used()
    bases = {next((n[: -len(s)] for s in HIST_SUFFIXES if n.endswith(s)), n) for n in used}
    assert set(KNOWN_METRICS) <= bases | used  # (KNOWN_METRICS == the code's table: test above)


def test_exprs_are_balanced():
    for expr in dash.all_exprs():
        stack = []
        pairs = {")": "(", "]": "[", "}": "{"}
        for ch in re.sub(r'"[^"]*"', '""', expr):
            if ch in "([{":
                stack.append(ch)
            elif ch in pairs:
                assert stack and stack.pop() == pairs[ch], f"unbalanced {ch!r} in {expr}"
        assert not stack, f"unclosed {stack} in {expr}"
        assert expr.count('"') % 2 == 0, expr


def test_ray_prefix_selector_matches_both_exporters():
    """Ray 2.60 exports ray.util.metrics as ray_<name>; prometheus_client exports <name>."""
    sel = re.search(r'__name__=~"([^"]*)"', dash.m("tailspec_rl_step")).group(1)
    rx = re.compile(f"^(?:{sel})$")  # Prometheus anchors label regexes
    assert rx.match("ray_tailspec_rl_step") and rx.match("tailspec_rl_step")
    assert not rx.match("tailspec_rl_step_total") and not rx.match("xray_tailspec_rl_step")
    assert dash.m("tailspec_worker_state", state="idle", worker="~1|2") == (
        '{__name__=~"(?:ray_)?tailspec_worker_state", state="idle", worker=~"1|2"}'
    )


@pytest.mark.parametrize("uid", UIDS)
def test_grafana_dashboard_model(uid):
    model = json.loads((REPO / "deploy" / "grafana" / f"{uid}.json").read_text())
    for key in ("title", "uid", "panels", "schemaVersion", "templating", "time", "tags", "version"):
        assert key in model, key
    assert model["uid"] == uid and len(uid) <= 40  # Grafana's uid limit
    assert isinstance(model["schemaVersion"], int) and model["schemaVersion"] >= 36
    assert "tailspec" in model["tags"] and model["id"] is None
    assert model["time"]["to"] == "now"
    (var,) = model["templating"]["list"]
    assert var["name"] == "datasource" and var["type"] == "datasource" and var["query"] == "prometheus"

    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in model["panels"]:
        for key in ("id", "type", "title", "gridPos"):
            assert key in p, (uid, key)
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"} and g["x"] + g["w"] <= 24 and g["h"] >= 1
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "state-timeline", "heatmap")
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["expr"] and t["datasource"]["uid"] == "${datasource}"
            if p["type"] == "heatmap":
                assert t["format"] == "heatmap"
        assert "defaults" in p["fieldConfig"] and "options" in p


def _panels(uid: str) -> list[dict]:
    return [p for p in json.loads((REPO / "deploy" / "grafana" / f"{uid}.json").read_text())["panels"]]


def _exprs_of(uid: str) -> str:
    return "\n".join(t["expr"] for p in _panels(uid) for t in p.get("targets", []))


def test_dashboards_cover_the_issue():
    longtail = _exprs_of("tailspec-longtail")
    assert "histogram_quantile(0.99" in longtail and "tailspec_response_length_tokens_bucket" in longtail
    assert "tailspec_active_batch_size" in longtail and "sum by (phase)" in longtail
    spec = _exprs_of("tailspec-speculation")
    assert "tailspec_accepted_tokens_total" in spec and "tailspec_drafted_tokens_total" in spec
    assert "sum by (drafter)" in spec and "tailspec_acceptance_length" in spec
    assert "sum by (arm)" in spec and "sum by (bucket, arm)" in spec
    bubbles = _panels("tailspec-bubbles")
    (timeline,) = [p for p in bubbles if p["type"] == "state-timeline"]
    texts = {o["text"] for o in timeline["fieldConfig"]["defaults"]["mappings"][0]["options"].values()}
    assert {"ROLLOUT", "IDLE", "TRAINING", "PREEMPTING"} <= texts
    assert texts == set(dash.WORKER_STATES)  # every state the code exports has a name...
    assert set(dash.WORKER_STATES) <= set(dash.WORKER_STATE_COLORS)  # ...and a colour
    assert "max by (worker)" in timeline["targets"][0]["expr"]
    assert "tailspec_bubble_trained_seconds_total" in _exprs_of("tailspec-bubbles")
    health = _exprs_of("tailspec-health")
    for name in (
        "tailspec_rl_step",
        "tailspec_reward_mean",
        "tailspec_policy_version",
        "tailspec_drafter_version",
    ):
        assert name in health
    types = {p["type"] for uid in UIDS for p in _panels(uid)}
    assert {"timeseries", "stat", "state-timeline", "heatmap", "row"} <= types


def test_builders_reject_bad_panels():
    with pytest.raises(ValueError):
        dash.Panel("piechart", "x", [dash.Target("1")])
    with pytest.raises(ValueError):
        dash.Panel("stat", "x", [dash.Target("1")], w=25)
    d = dash.Dashboard(
        "u",
        "t",
        "d",
        [dash.Row("r", [dash.stat("a", dash.Target("1"), w=20), dash.stat("b", dash.Target("2"), w=10)])],
    )
    panels = d.to_json()["panels"]
    assert [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels] == [(0, 0), (0, 1), (0, 5)]  # wraps
