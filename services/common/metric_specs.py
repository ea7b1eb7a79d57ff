"""Every tailspec metric, as data: ``METRICS`` (name, type, unit, labels, description, histogram buckets) and
``docs_table()``, the Markdown table of ``docs/metrics.md``. ``metrics.py`` creates and records them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TYPES = ("counter", "gauge", "histogram")

WORKER_STATES = ("STARTING", "ROLLOUT", "IDLE", "TRAINING", "PREEMPTING", "FAILED", "STOPPED")
# metrics.jsonl row key -> `phase` label of tailspec_step_phase_seconds
STEP_PHASE_KEYS = {
    "rollout_seconds": "rollout",
    "reward_seconds": "reward",
    "train_seconds": "train",
    "weight_sync_seconds": "weight_sync",
}

_ACCEPTANCE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
_LENGTH_BUCKETS = (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)
_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


@dataclass(frozen=True)
class MetricSpec:
    """One documented metric. ``name`` is the exported name (counters end in ``_total``)."""

    name: str
    type: str  # counter | gauge | histogram
    unit: str
    labels: tuple[str, ...]
    description: str
    boundaries: tuple[float, ...] | None = None  # histograms: bucket upper bounds

    @property
    def short_name(self) -> str:
        """Name without the ``tailspec_`` prefix and a counter's ``_total`` (what ``Metrics`` takes)."""
        n = self.name.removeprefix("tailspec_")
        return n.removesuffix("_total") if self.type == "counter" else n


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "tailspec_accepted_tokens_total",
        "counter",
        "tokens",
        ("drafter",),
        "Draft tokens accepted by verification (lossless rejection sampling), by drafter.",
    ),
    MetricSpec(
        "tailspec_drafted_tokens_total",
        "counter",
        "tokens",
        ("drafter",),
        "Draft tokens proposed to verification, by drafter; accepted / drafted = acceptance rate.",
    ),
    MetricSpec(
        "tailspec_acceptance_length",
        "histogram",
        "tokens",
        ("drafter",),
        "Acceptance length tau per verify step and request: accepted draft tokens + 1 (the bonus token).",
        _ACCEPTANCE_BUCKETS,
    ),
    MetricSpec(
        "tailspec_active_batch_size",
        "gauge",
        "requests",
        ("worker",),
        "Requests decoding in the current decode step of a rollout worker (set by the actor at every decode step; "
        "0 between rollouts).",
    ),
    MetricSpec(
        "tailspec_response_length_tokens",
        "histogram",
        "tokens",
        (),
        "Length of each finished response (generated tokens).",
        _LENGTH_BUCKETS,
    ),
    MetricSpec(
        "tailspec_worker_state",
        "gauge",
        "1",
        ("worker", "state"),
        "1 for the state a worker is in, 0 for the others (STARTING, ROLLOUT, IDLE, TRAINING, PREEMPTING, "
        "FAILED, STOPPED); exported by the coordinator on every transition.",
    ),
    MetricSpec(
        "tailspec_bubble_seconds_total",
        "counter",
        "seconds",
        ("worker",),
        "Idle worker-seconds during rollout (a worker done with its share while others still decode).",
    ),
    MetricSpec(
        "tailspec_bubble_trained_seconds_total",
        "counter",
        "seconds",
        ("worker",),
        "Bubble seconds spent training the drafter on the spot trainer (granted until preempted).",
    ),
    MetricSpec(
        "tailspec_drafter_version",
        "gauge",
        "version",
        (),
        "Newest learned-drafter version published by the spot trainer (0 = none).",
    ),
    MetricSpec(
        "tailspec_policy_version",
        "gauge",
        "version",
        (),
        "Policy version the rollout actors decode with (0 = the initial policy).",
    ),
    MetricSpec(
        "tailspec_tuner_arm_selections_total",
        "counter",
        "selections",
        ("bucket", "arm"),
        "Decode steps run with each tuner arm, by the tuner's active-batch-size bucket the step fell in (e.g. "
        "bucket '8-15', arm 'suffix-k8-w1').",
    ),
    MetricSpec(
        "tailspec_step_phase_seconds",
        "histogram",
        "seconds",
        ("phase",),
        "Wall time of each RL-step phase: rollout, reward, train, weight_sync.",
        _SECONDS_BUCKETS,
    ),
    MetricSpec(
        "tailspec_stream_frames_dropped_total",
        "counter",
        "frames",
        ("reason",),
        "Hidden-state stream frames a spot-trainer replica dropped, by reason: malformed, unauthenticated "
        "(bad or missing MAC), out_of_range (policy version far ahead, bad token ids or shapes), stale, error.",
    ),
    MetricSpec("tailspec_rl_step", "gauge", "step", (), "The current (last finished) RL step."),
    MetricSpec("tailspec_reward_mean", "gauge", "reward", (), "Mean reward of the last RL step's responses."),
)


def docs_table(specs: Sequence[MetricSpec] = METRICS) -> str:
    """The metric table as Markdown (name, type, unit, labels, description)."""
    lines = [
        "| Metric | Type | Unit | Labels | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in specs:
        labels = ", ".join(f"`{label}`" for label in s.labels) or "—"
        desc = s.description.replace("|", "\\|")
        if s.boundaries:
            desc += " Buckets: " + ", ".join(f"{b:g}" for b in s.boundaries) + "."
        lines.append(f"| `{s.name}` | {s.type} | {s.unit} | {labels} | {desc} |")
    lines.append("")
    lines.append(
        "Inside Ray the metrics are exported by Ray's metrics agent with Ray's `ray_` prefix "
        "(`ray_tailspec_policy_version`) and Ray's own labels added (`Component`, `NodeAddress`, `SessionName`, "
        "`WorkerId`, ...)."
    )
    return "\n".join(lines) + "\n"
