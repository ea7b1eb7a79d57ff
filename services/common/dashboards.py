"""Grafana dashboards as code: small builders and the four tailspec dashboards.

    python -m services.common.dashboards            # re-render deploy/grafana/*.json and the chart's copies

``Dashboard`` -> ``Row`` -> ``Panel`` (timeseries, stat, state-timeline, heatmap) -> ``Target`` (PromQL, legend)
render Grafana dashboard JSON models (schemaVersion 39: Grafana 10/11) with a templated Prometheus datasource
``${datasource}``. ``render_all(out_dir)`` writes one file per dashboard; the rendered files are committed in
``deploy/grafana/`` (import them in Grafana) and in ``helm/tailspec/dashboards/`` (the chart turns them into
ConfigMaps for the Grafana sidecar; Helm cannot read files outside the chart).

Metric names: the code exports ``tailspec_*`` metrics (services/common/metrics.py). Inside Ray they go through
``ray.util.metrics`` and Ray's metrics agent, which exports them as ``ray_tailspec_*`` (Ray 2.60: namespace
``ray``, counters keep their ``_total`` suffix); outside Ray ``prometheus_client`` exports the bare
``tailspec_*``. Every expression therefore selects by name with the regex ``(?:ray_)?tailspec_...`` (see
:func:`m`), so the same dashboards work with both exporters.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.metrics import WORKER_STATES as _METRIC_WORKER_STATES

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
TAGS = ["tailspec"]
RAY_PREFIX = "ray_"
# The worker-state gauge is 1 for a worker's current state and 0 for the others; the state timeline encodes
# the states as numbers 1..N in the order of services.common.metrics.WORKER_STATES.
WORKER_STATES = {state: i + 1 for i, state in enumerate(_METRIC_WORKER_STATES)}
WORKER_STATE_COLORS = {
    "STARTING": "light-blue",
    "ROLLOUT": "green",
    "IDLE": "red",
    "TRAINING": "blue",
    "PREEMPTING": "orange",
    "FAILED": "dark-red",
    "STOPPED": "gray",
}

_NAME_RE = re.compile(r'__name__=~"\(\?:ray_\)\?([a-zA-Z_:][a-zA-Z0-9_:]*)"')


# ----------------------------------------------------------------------------------------------- PromQL
def m(name: str, **labels: str) -> str:
    """Selector of one exported metric under either exporter: ``{__name__=~"(?:ray_)?<name>", k="v"}``.

    A label value starting with ``~`` is a regex match (``state="~roll.*"`` -> ``state=~"roll.*"``).
    """
    parts = [f'__name__=~"(?:{RAY_PREFIX})?{name}"']
    for k, v in labels.items():
        parts.append(f'{k}=~"{v[1:]}"' if v.startswith("~") else f'{k}="{v}"')
    return "{" + ", ".join(parts) + "}"


def rate(name: str, window: str = "$__rate_interval", **labels: str) -> str:
    return f"rate({m(name, **labels)}[{window}])"


def quantile(q: float, hist: str, by: str = "") -> str:
    """``histogram_quantile`` of a histogram metric (its ``_bucket`` series), optionally per label ``by``."""
    keys = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({keys}) ({rate(hist + '_bucket')}))"


def hist_mean(hist: str, by: str = "") -> str:
    grp = f"sum by ({by}) " if by else "sum "
    return f"{grp}({rate(hist + '_sum')}) / {grp}({rate(hist + '_count')})"


# --------------------------------------------------------------------------------------------- builders
@dataclass
class Target:
    expr: str
    legend: str = ""
    format: str = "time_series"  # time_series | heatmap
    instant: bool = False

    def to_json(self, ref_id: str) -> dict[str, Any]:
        return {
            "refId": ref_id,
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": self.expr,
            "legendFormat": self.legend or "__auto",
            "format": self.format,
            "range": not self.instant,
            "instant": self.instant,
        }


PANEL_TYPES = ("timeseries", "stat", "state-timeline", "heatmap")


@dataclass
class Panel:
    type: str
    title: str
    targets: list[Target]
    description: str = ""
    unit: str = "short"
    w: int = 12
    h: int = 8
    min: float | None = None
    max: float | None = None
    stack: bool = False
    decimals: int | None = None
    mappings: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.type not in PANEL_TYPES:
            raise ValueError(f"panel type {self.type!r} is not one of {PANEL_TYPES}")
        if not 1 <= self.w <= GRID_WIDTH:
            raise ValueError(f"panel width {self.w} not in 1..{GRID_WIDTH}")

    def _defaults(self) -> dict[str, Any]:
        d: dict[str, Any] = {"unit": self.unit, "mappings": self.mappings}
        if self.min is not None:
            d["min"] = self.min
        if self.max is not None:
            d["max"] = self.max
        if self.decimals is not None:
            d["decimals"] = self.decimals
        if self.type == "timeseries":
            d["color"] = {"mode": "palette-classic"}
            d["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 25 if self.stack else 10,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"mode": "normal" if self.stack else "none", "group": "A"},
            }
        elif self.type == "stat":
            d["color"] = {"mode": "thresholds"}
            d["thresholds"] = {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}
        elif self.type == "state-timeline":
            d["color"] = {"mode": "fixed", "fixedColor": "gray"}
            d["custom"] = {"fillOpacity": 80, "lineWidth": 0}
        elif self.type == "heatmap":
            d["custom"] = {"scaleDistribution": {"type": "linear"}}
        return d

    def _options(self) -> dict[str, Any]:
        legend = {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []}
        if self.type == "timeseries":
            return {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}
        if self.type == "stat":
            return {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "area",
                "justifyMode": "auto",
                "textMode": "auto",
                "orientation": "auto",
            }
        if self.type == "state-timeline":
            return {
                "mergeValues": True,
                "showValue": "never",
                "alignValue": "left",
                "rowHeight": 0.9,
                "legend": legend,
                "tooltip": {"mode": "single", "sort": "none"},
            }
        return {  # heatmap of pre-bucketed Prometheus histograms
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "exponent": 0.5,
                "steps": 64,
                "fill": "dark-orange",
            },
            "yAxis": {"axisPlacement": "left", "unit": self.unit},
            "rowsFrame": {"layout": "auto"},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False},
            "cellValues": {},
            "showValue": "never",
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        }

    def to_json(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        return {
            "id": panel_id,
            "type": self.type,
            "title": self.title,
            "description": self.description,
            "datasource": dict(DATASOURCE),
            "gridPos": {"h": self.h, "w": self.w, "x": x, "y": y},
            "targets": [t.to_json(chr(ord("A") + i)) for i, t in enumerate(self.targets)],
            "fieldConfig": {"defaults": self._defaults(), "overrides": []},
            "options": self._options(),
        }


def timeseries(title: str, *targets: Target, **kw: Any) -> Panel:
    return Panel("timeseries", title, list(targets), **kw)


def stat(title: str, *targets: Target, **kw: Any) -> Panel:
    kw.setdefault("w", 6)
    kw.setdefault("h", 4)
    return Panel("stat", title, list(targets), **kw)


def heatmap(title: str, hist: str, **kw: Any) -> Panel:
    """Distribution over time of a histogram metric: buckets' increase per interval, by ``le``."""
    t = Target(f"sum by (le) (increase({m(hist + '_bucket')}[$__interval]))", "{{le}}", format="heatmap")
    return Panel("heatmap", title, [t], **kw)


def state_timeline(
    title: str, *targets: Target, states: dict[str, int], colors: dict[str, str], **kw: Any
) -> Panel:
    mapping = {
        "type": "value",
        "options": {
            str(code): {"text": name, "color": colors.get(name, "gray"), "index": i}
            for i, (name, code) in enumerate(states.items())
        },
    }
    kw.setdefault("w", GRID_WIDTH)
    return Panel("state-timeline", title, list(targets), mappings=[mapping], **kw)


@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[Row]
    tags: list[str] = field(default_factory=lambda: list(TAGS))
    refresh: str = "10s"
    time_from: str = "now-1h"

    def panels_json(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        y = 0
        pid = 1
        for row in self.rows:
            out.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": row.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            pid += 1
            y += 1
            x, line_h = 0, 0
            for p in row.panels:
                if x + p.w > GRID_WIDTH:  # wrap to the next line
                    y += line_h
                    x, line_h = 0, 0
                out.append(p.to_json(pid, x, y))
                pid += 1
                x += p.w
                line_h = max(line_h, p.h)
            y += line_h
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "id": None,
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": self.tags,
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "fiscalYearStartMonth": 0,
            "liveNow": False,
            "refresh": self.refresh,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "templating": {
                "list": [
                    {
                        "name": "datasource",
                        "label": "Prometheus",
                        "type": "datasource",
                        "query": "prometheus",
                        "current": {},
                        "hide": 0,
                        "includeAll": False,
                        "multi": False,
                        "options": [],
                        "refresh": 1,
                        "regex": "",
                        "skipUrlSync": False,
                    }
                ]
            },
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "links": [
                {
                    "type": "dashboards",
                    "title": "tailspec",
                    "tags": list(TAGS),
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                    "icon": "external link",
                    "targetBlank": False,
                    "tooltip": "",
                    "url": "",
                }
            ],
            "panels": self.panels_json(),
        }

    def exprs(self) -> list[str]:
        return [t.expr for row in self.rows for p in row.panels for t in p.targets]


# ------------------------------------------------------------------------------------------- dashboards
RESP = "tailspec_response_length_tokens"
PHASE = "tailspec_step_phase_seconds"
ACC_LEN = "tailspec_acceptance_length"
ACCEPTED = "tailspec_accepted_tokens_total"
DRAFTED = "tailspec_drafted_tokens_total"
ARMS = "tailspec_tuner_arm_selections_total"
STATE = "tailspec_worker_state"
BUBBLE = "tailspec_bubble_seconds_total"
TRAINED = "tailspec_bubble_trained_seconds_total"

_PROVENANCE = (
    " Metrics are selected as (ray_)?tailspec_*: Ray's metrics agent prefixes ray.util.metrics names with"
    " ray_; the driver's prometheus_client endpoint exports them bare."
)


def longtail() -> Dashboard:
    return Dashboard(
        uid="tailspec-longtail",
        title="tailspec / Long tail",
        description="Response-length quantiles, active batch size and RL-step phase timing." + _PROVENANCE,
        rows=[
            Row(
                "Response length",
                [
                    timeseries(
                        "Response length quantiles",
                        Target(quantile(0.5, RESP), "p50"),
                        Target(quantile(0.9, RESP), "p90"),
                        Target(quantile(0.99, RESP), "p99"),
                        Target(hist_mean(RESP), "mean"),
                        description="Finished responses' length in tokens. A p99 far above p50 is the long tail"
                        " that keeps the rollout running after most requests are done.",
                        w=16,
                    ),
                    stat(
                        "Tail ratio p99 / p50",
                        Target(f"{quantile(0.99, RESP)} / {quantile(0.5, RESP)}", "p99/p50"),
                        description="How much longer the longest 1% of responses are than the median one.",
                        decimals=2,
                        w=8,
                        h=8,
                    ),
                    heatmap(
                        "Response length distribution",
                        RESP,
                        description="Finished responses per length bucket and interval.",
                        w=24,
                    ),
                ],
            ),
            Row(
                "Active batch",
                [
                    timeseries(
                        "Active batch size",
                        Target(f"sum({m('tailspec_active_batch_size')})", "all rollout actors"),
                        Target(f"sum by (worker) ({m('tailspec_active_batch_size')})", "worker {{worker}}"),
                        description="Requests decoding right now. Within a step it falls from B*G to the few"
                        " long responses: decoding turns memory-bound, which is where speculation pays.",
                        w=16,
                        min=0,
                    ),
                    stat(
                        "Active batch size now",
                        Target(f"sum({m('tailspec_active_batch_size')})", "active"),
                        w=8,
                        h=8,
                    ),
                ],
            ),
            Row(
                "RL step phases",
                [
                    timeseries(
                        "Mean phase duration",
                        Target(hist_mean(PHASE, by="phase"), "{{phase}}"),
                        description="Mean seconds per occurrence of each phase of an RL step (rollout, reward,"
                        " train, weight_sync).",
                        unit="s",
                        w=8,
                        min=0,
                    ),
                    timeseries(
                        "p90 phase duration",
                        Target(quantile(0.9, PHASE, by="phase"), "{{phase}}"),
                        unit="s",
                        w=8,
                        min=0,
                    ),
                    timeseries(
                        "Wall-time share per phase",
                        Target(f"sum by (phase) ({rate(PHASE + '_sum')})", "{{phase}}"),
                        description="Seconds spent in each phase per second of wall time.",
                        unit="percentunit",
                        stack=True,
                        w=8,
                        min=0,
                    ),
                    stat("RL step", Target(f"max({m('tailspec_rl_step')})", "step"), w=24, h=4),
                ],
            ),
        ],
    )


def speculation() -> Dashboard:
    acc_rate = f"sum by (drafter) ({rate(ACCEPTED)}) / sum by (drafter) ({rate(DRAFTED)})"
    return Dashboard(
        uid="tailspec-speculation",
        title="tailspec / Speculation",
        description="Acceptance rate and acceptance length per drafter, and the tuner's arm choices."
        + _PROVENANCE,
        rows=[
            Row(
                "Acceptance",
                [
                    timeseries(
                        "Acceptance rate by drafter",
                        Target(acc_rate, "{{drafter}}"),
                        description="Accepted / drafted tokens. Lossless: a low rate costs speed, never"
                        " quality.",
                        unit="percentunit",
                        w=12,
                        min=0,
                        max=1,
                    ),
                    timeseries(
                        "Mean acceptance length (tau) by drafter",
                        Target(hist_mean(ACC_LEN, by="drafter"), "{{drafter}}"),
                        description="Tokens produced per verify step (accepted + 1).",
                        w=12,
                        min=0,
                    ),
                    timeseries(
                        "Drafted and accepted tokens / s",
                        Target(f"sum by (drafter) ({rate(DRAFTED)})", "drafted {{drafter}}"),
                        Target(f"sum by (drafter) ({rate(ACCEPTED)})", "accepted {{drafter}}"),
                        unit="short",
                        w=12,
                        min=0,
                    ),
                    heatmap("Acceptance length distribution", ACC_LEN, w=12),
                    stat(
                        "Acceptance rate (all drafters)",
                        Target(f"sum({rate(ACCEPTED)}) / sum({rate(DRAFTED)})", "rate"),
                        unit="percentunit",
                        w=8,
                    ),
                    stat("p90 acceptance length", Target(quantile(0.9, ACC_LEN), "p90"), decimals=2, w=8),
                    stat("Drafter version", Target(f"max({m('tailspec_drafter_version')})", "drafter"), w=8),
                ],
            ),
            Row(
                "Tuner",
                [
                    timeseries(
                        "Arm selections / s",
                        Target(f"sum by (arm) ({rate(ARMS)})", "{{arm}}"),
                        description="Which strategy (drafter, depth, width, or plain decoding) the bandit picks.",
                        stack=True,
                        w=12,
                        min=0,
                    ),
                    timeseries(
                        "Arm share per batch-size bucket",
                        Target(
                            f"sum by (bucket, arm) ({rate(ARMS)}) / ignoring (arm) group_left "
                            f"sum by (bucket) ({rate(ARMS)})",
                            "{{bucket}} {{arm}}",
                        ),
                        description="Per active-batch-size bucket, the share of decode steps each arm got.",
                        unit="percentunit",
                        w=12,
                        min=0,
                        max=1,
                    ),
                ],
            ),
        ],
    )


def _state_code_expr() -> str:
    terms = [f"{m(STATE, state=s)} * {code}" for s, code in WORKER_STATES.items()]
    return "max by (worker) (" + " or ".join(terms) + ")"


def bubbles() -> Dashboard:
    return Dashboard(
        uid="tailspec-bubbles",
        title="tailspec / Bubbles",
        description="Worker states over time, idle time (bubbles) and how much of it trained the drafter."
        + _PROVENANCE,
        rows=[
            Row(
                "Worker states",
                [
                    state_timeline(
                        "Worker state",
                        Target(_state_code_expr(), "worker {{worker}}"),
                        states=WORKER_STATES,
                        colors=WORKER_STATE_COLORS,
                        description="The coordinator's state machine per worker: ROLLOUT, IDLE (a bubble),"
                        " TRAINING (the spot trainer uses the bubble), PREEMPTING (taken back for rollout),"
                        " STARTING, FAILED, STOPPED.",
                        h=9,
                    ),
                    timeseries(
                        "Workers per state",
                        Target(f"sum by (state) ({m(STATE)})", "{{state}}"),
                        stack=True,
                        w=24,
                        min=0,
                    ),
                ],
            ),
            Row(
                "Bubbles",
                [
                    timeseries(
                        "Bubble time share per worker",
                        Target(f"sum by (worker) ({rate(BUBBLE)})", "worker {{worker}}"),
                        description="Idle seconds per second of wall time, per worker.",
                        unit="percentunit",
                        w=12,
                        min=0,
                    ),
                    timeseries(
                        "Bubble utilization",
                        Target(f"sum({rate(TRAINED)}) / sum({rate(BUBBLE)})", "all workers"),
                        Target(
                            f"sum by (worker) ({rate(TRAINED)}) / sum by (worker) ({rate(BUBBLE)})",
                            "worker {{worker}}",
                        ),
                        description="Share of bubble time spent training the drafter.",
                        unit="percentunit",
                        w=12,
                        min=0,
                        max=1,
                    ),
                    stat(
                        "Bubble utilization (range)",
                        Target(
                            f"sum(increase({m(TRAINED)}[$__range])) / sum(increase({m(BUBBLE)}[$__range]))",
                            "utilization",
                        ),
                        unit="percentunit",
                    ),
                    stat(
                        "Bubble seconds (range)",
                        Target(f"sum(increase({m(BUBBLE)}[$__range]))", "s"),
                        unit="s",
                    ),
                    stat(
                        "Trained bubble seconds (range)",
                        Target(f"sum(increase({m(TRAINED)}[$__range]))", "s"),
                        unit="s",
                    ),
                    stat("Drafter version", Target(f"max({m('tailspec_drafter_version')})", "drafter")),
                ],
            ),
        ],
    )


def health() -> Dashboard:
    return Dashboard(
        uid="tailspec-health",
        title="tailspec / Health",
        description="Is the run making progress: RL step, versions, reward, throughput, reporting workers."
        + _PROVENANCE,
        rows=[
            Row(
                "Progress",
                [
                    stat("RL step", Target(f"max({m('tailspec_rl_step')})", "step")),
                    stat("Policy version", Target(f"max({m('tailspec_policy_version')})", "policy")),
                    stat("Drafter version", Target(f"max({m('tailspec_drafter_version')})", "drafter")),
                    stat(
                        "RL steps in the last 15 min",
                        Target(f"max(changes({m('tailspec_rl_step')}[15m]))", "steps"),
                        description="0 while a run is supposed to be training means it is stuck.",
                    ),
                    timeseries(
                        "Reward mean",
                        Target(f"max({m('tailspec_reward_mean')})", "reward"),
                        description="Mean reward of the step's rollouts (answer match + format reward).",
                        w=12,
                    ),
                    timeseries(
                        "RL step and versions",
                        Target(f"max({m('tailspec_rl_step')})", "RL step"),
                        Target(f"max({m('tailspec_policy_version')})", "policy version"),
                        Target(f"max({m('tailspec_drafter_version')})", "drafter version"),
                        w=12,
                        min=0,
                    ),
                ],
            ),
            Row(
                "Throughput and workers",
                [
                    timeseries(
                        "Generated tokens / s (finished responses)",
                        Target(f"sum({rate(RESP + '_sum')})", "tokens/s"),
                        w=12,
                        min=0,
                    ),
                    timeseries(
                        "Step time by phase (s per s)",
                        Target(f"sum by (phase) ({rate(PHASE + '_sum')})", "{{phase}}"),
                        unit="percentunit",
                        stack=True,
                        w=12,
                        min=0,
                    ),
                    stat(
                        "Workers reporting",
                        Target(f"count(count by (worker) ({m(STATE)}))", "workers"),
                        description="Workers whose state gauge is being scraped.",
                    ),
                    stat(
                        "Workers failed",
                        Target(f"sum({m(STATE, state='FAILED')}) or vector(0)", "failed"),
                        description="Workers the coordinator marked FAILED (missed heartbeats).",
                    ),
                    stat(
                        "Workers preempting",
                        Target(f"sum({m(STATE, state='PREEMPTING')}) or vector(0)", "preempting"),
                    ),
                    stat(
                        "Acceptance rate",
                        Target(f"sum({rate(ACCEPTED)}) / sum({rate(DRAFTED)})", "rate"),
                        unit="percentunit",
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = {
    "tailspec-longtail": longtail,
    "tailspec-speculation": speculation,
    "tailspec-bubbles": bubbles,
    "tailspec-health": health,
}


# ------------------------------------------------------------------------------------------------ output
def all_dashboards() -> list[Dashboard]:
    return [build() for build in DASHBOARDS.values()]


def dump(d: Dashboard) -> str:
    """The committed file's exact text (stable: sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(d.to_json(), indent=2, sort_keys=True) + "\n"


def render_all(out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<uid>.json`` for every dashboard; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in all_dashboards():
        p = out / f"{d.uid}.json"
        p.write_text(dump(d))
        paths.append(p)
    return paths


def all_exprs() -> list[str]:
    return [e for d in all_dashboards() for e in d.exprs()]


def metric_names_in(expr: str) -> set[str]:
    """The series names an expression selects (``tailspec_x_bucket`` for a histogram's buckets)."""
    return set(_NAME_RE.findall(expr))


def metric_names_used() -> set[str]:
    """Every series name any dashboard expression selects (without the optional ``ray_`` prefix)."""
    return {n for e in all_exprs() for n in metric_names_in(e)}


def default_out_dirs() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    return [root / "deploy" / "grafana", root / "helm" / "tailspec" / "dashboards"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dirs = [Path(a) for a in args] or default_out_dirs()
    for d in dirs:
        for p in render_all(d):
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
