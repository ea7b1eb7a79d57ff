"""The four tailspec Grafana dashboards (long tail, speculation, bubbles, health) and their rendering.

    python -m services.common.dashboards            # re-render deploy/grafana/*.json and the chart's copies

The builders (``Dashboard``, ``Row``, ``Panel``, ``Target``, the PromQL helpers ``m``, ``rate``, ``quantile``,
``hist_mean``) live in ``services/common/dashboard_builders.py`` and are re-exported here. ``render_all(out_dir)``
writes one file per dashboard; the rendered files are committed in ``deploy/grafana/`` (import them in Grafana)
and in ``helm/tailspec/dashboards/`` (the chart turns them into ConfigMaps for the Grafana sidecar; Helm cannot
read files outside the chart). Every expression selects metrics as ``(?:ray_)?tailspec_*`` so the dashboards
work with Ray's metrics agent (``ray_`` prefix) and with the driver's ``prometheus_client`` endpoint alike.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.common.dashboard_builders import (
    WORKER_STATE_COLORS,
    WORKER_STATES,
    Dashboard,
    Panel,  # noqa: F401 - re-exported with the other builders
    Row,
    Target,
    heatmap,
    hist_mean,
    m,
    metric_names_in,
    quantile,
    rate,
    stat,
    state_timeline,
    timeseries,
)

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
