"""Grafana dashboard builders: PromQL helpers and ``Dashboard`` -> ``Row`` -> ``Panel`` -> ``Target``.

``Panel`` types: timeseries, stat, state-timeline, heatmap. ``Target`` holds one PromQL expression and its
legend. ``Dashboard.to_json()`` renders a Grafana dashboard JSON model (schemaVersion 39: Grafana 10/11) with
a templated Prometheus datasource ``${datasource}``. The tailspec dashboards themselves are defined in
``services/common/dashboards.py``.

Metric names: the code exports ``tailspec_*`` metrics (services/common/metrics.py). Inside Ray they go through
``ray.util.metrics`` and Ray's metrics agent, which exports them as ``ray_tailspec_*`` (Ray 2.60: namespace
``ray``, counters keep their ``_total`` suffix); outside Ray ``prometheus_client`` exports the bare
``tailspec_*``. Every expression therefore selects by name with the regex ``(?:ray_)?tailspec_...`` (see
:func:`m`), so the same dashboards work with both exporters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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


def metric_names_in(expr: str) -> set[str]:
    """The series names an expression selects (``tailspec_x_bucket`` for a histogram's buckets)."""
    return set(_NAME_RE.findall(expr))
