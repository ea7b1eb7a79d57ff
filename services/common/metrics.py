"""One metrics facade: ``ray.util.metrics`` inside Ray, ``prometheus_client`` outside.

Inside Ray (a driver or worker with Ray initialized) metrics go through ``ray.util.metrics`` and are exported
by Ray's metrics agent (Prometheus format, on every node; Ray prefixes application metrics with ``ray_``,
so ``tailspec_policy_version`` is scraped as ``ray_tailspec_policy_version``). Outside Ray they go to a
``prometheus_client`` registry of their own, served by ``Metrics.start_http_server(port)``::

    m = Metrics()                                   # backend="auto"
    accepted = m.counter("accepted_tokens", "Accepted draft tokens", unit="tokens", tag_keys=("drafter",))
    accepted.inc(12, {"drafter": "suffix"})
    port = m.start_http_server(0)                   # prometheus backend only; None under Ray

    tm = TailspecMetrics()                          # every metric of METRICS, with helpers
    tm.record_step(row)                             # one metrics.jsonl row
    tm.record_spec("suffix", drafted=40, accepted=31, acceptance_lengths=[3, 2, 4])

Both backends behave the same for callers: a metric's ``tags`` must name exactly its ``tag_keys`` (values
are turned into strings), counters refuse negative increments and ignore 0, histograms need bucket
boundaries (> 0, increasing). Counter names are given without ``_total``; both backends export them with it.
``METRICS`` (``metric_specs.py``) lists every tailspec metric (name, type, unit, labels, description);
``docs_table()`` renders it.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.common.metric_specs import (
    METRICS,
    STEP_PHASE_KEYS,
    TYPES,
    WORKER_STATES,
    MetricSpec,
    docs_table,
)

BACKENDS = ("auto", "ray", "prometheus")


# ---------------------------------------------------------------------------------------------- facade
def ray_active() -> bool:
    """True in a Ray driver or worker with Ray initialized (Ray is not imported to find out)."""
    ray = sys.modules.get("ray")
    try:
        return bool(ray is not None and ray.is_initialized())
    except Exception:  # noqa: BLE001 - a half-imported ray counts as absent
        return False


def _check_boundaries(name: str, boundaries: Sequence[float] | None) -> tuple[float, ...]:
    if not boundaries:
        raise ValueError(f"histogram {name!r} needs bucket boundaries")
    b = tuple(float(x) for x in boundaries)
    if any(x <= 0 or not math.isfinite(x) for x in b) or any(x >= y for x, y in zip(b, b[1:])):
        raise ValueError(f"histogram {name!r}: boundaries must be finite, > 0 and increasing, got {list(b)}")
    return b


class _Metric:
    type = ""

    def __init__(self, name: str, tag_keys: tuple[str, ...], impl: Any, backend: str):
        self.name = name
        self.tag_keys = tag_keys
        self._impl = impl
        self.backend = backend

    def _tags(self, tags: Mapping[str, Any] | None) -> dict[str, str]:
        tags = dict(tags or {})
        if set(tags) != set(self.tag_keys):
            missing = sorted(set(self.tag_keys) - set(tags))
            extra = sorted(set(tags) - set(self.tag_keys))
            raise ValueError(
                f"metric {self.name!r} takes tags {list(self.tag_keys)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        return {k: str(v) for k, v in tags.items()}

    def _target(self, tags: Mapping[str, Any] | None):
        """prometheus: the labelled child; ray: (impl, tags)."""
        t = self._tags(tags)
        if self.backend == "prometheus":
            return self._impl.labels(**t) if self.tag_keys else self._impl
        return t

    def touch(self, tags: Mapping[str, Any] | None = None) -> None:
        """Create the series of ``tags`` at zero without changing a value it already has, so that
        ``increase()`` / ``rate()`` count its first increment. prometheus: ``labels(...)``; Ray: a counter records
        0 (``Counter._record``: Ray's public ``inc`` refuses 0), a gauge is left to its first ``set``, a
        histogram to its first observation (Ray has no way to create either without a value)."""
        target = self._target(tags)  # prometheus: creates the labelled child at 0
        if self.backend == "ray" and self.type == "counter":
            record = getattr(self._impl, "_record", None)
            if record is not None:
                record(0.0, tags=target or None)

    def __repr__(self) -> str:
        return f"<{self.type} {self.name} {list(self.tag_keys)} ({self.backend})>"


class Counter(_Metric):
    type = "counter"

    def inc(self, value: float = 1.0, tags: Mapping[str, Any] | None = None) -> None:
        value = float(value)
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"counter {self.name!r}: increment must be finite and >= 0, got {value}")
        target = self._target(tags)
        if value == 0:
            return
        if self.backend == "prometheus":
            target.inc(value)
        else:
            self._impl.inc(value, tags=target or None)


class Gauge(_Metric):
    type = "gauge"

    def set(self, value: float, tags: Mapping[str, Any] | None = None) -> None:
        value = float(value)
        target = self._target(tags)
        if self.backend == "prometheus":
            target.set(value)
        else:
            self._impl.set(value, tags=target or None)


class Histogram(_Metric):
    type = "histogram"

    def __init__(self, name, tag_keys, impl, backend, boundaries: tuple[float, ...]):
        super().__init__(name, tag_keys, impl, backend)
        self.boundaries = boundaries

    def observe(self, value: float, tags: Mapping[str, Any] | None = None) -> None:
        value = float(value)
        target = self._target(tags)
        if self.backend == "prometheus":
            target.observe(value)
        else:
            self._impl.observe(value, tags=target or None)


class Metrics:
    """Creates metrics on one backend. ``backend="auto"``: Ray if initialized in this process, else prometheus.

    Metrics are cached by name: asking twice for the same name and type returns the same object; the same
    name with another type or other tag keys raises ``ValueError``.
    """

    def __init__(self, backend: str = "auto", prefix: str = "tailspec", registry: Any = None):
        if backend not in BACKENDS:
            raise ValueError(f"metrics backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "auto":
            backend = "ray" if ray_active() else "prometheus"
        self.backend = backend
        self.prefix = prefix
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}
        self._http: Any = None
        if backend == "prometheus":
            from prometheus_client import CollectorRegistry

            self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        else:
            if registry is not None:
                raise ValueError("a registry only applies to the prometheus backend")
            self.registry = None

    def full_name(self, name: str, kind: str) -> str:
        base = name.removesuffix("_total") if kind == "counter" else name
        if self.prefix and not base.startswith(f"{self.prefix}_"):
            base = f"{self.prefix}_{base}"
        return base

    def _get(
        self,
        kind: str,
        name: str,
        description: str,
        unit: str,
        tag_keys: Iterable[str],
        boundaries: Sequence[float] | None,
    ) -> _Metric:
        full = self.full_name(name, kind)
        keys = tuple(tag_keys or ())
        with self._lock:
            have = self._metrics.get(full)
            if have is not None:
                if have.type != kind or have.tag_keys != keys:
                    raise ValueError(
                        f"metric {full!r} already exists as {have.type} with tags {list(have.tag_keys)}"
                    )
                return have
            desc = description or full
            if unit and unit != "1":
                desc = f"{desc} [{unit}]" if f"[{unit}]" not in desc else desc
            b = _check_boundaries(full, boundaries) if kind == "histogram" else None
            impl = self._make(kind, full, desc, keys, b)
            m = Histogram(full, keys, impl, self.backend, b) if kind == "histogram" else None
            if m is None:
                m = (Counter if kind == "counter" else Gauge)(full, keys, impl, self.backend)
            self._metrics[full] = m
            return m

    def _make(self, kind: str, name: str, desc: str, keys: tuple[str, ...], boundaries):
        if self.backend == "ray":
            from ray.util import metrics as rm

            if kind == "counter":
                return rm.Counter(name, description=desc, tag_keys=keys)
            if kind == "gauge":
                return rm.Gauge(name, description=desc, tag_keys=keys)
            return rm.Histogram(name, description=desc, boundaries=list(boundaries), tag_keys=keys)
        import prometheus_client as pc

        kw = dict(labelnames=keys, registry=self.registry)
        if kind == "counter":
            return pc.Counter(name, desc, **kw)
        if kind == "gauge":
            return pc.Gauge(name, desc, **kw)
        return pc.Histogram(name, desc, buckets=[*boundaries, math.inf], **kw)

    def counter(
        self, name: str, description: str = "", unit: str = "", tag_keys: Iterable[str] = (), boundaries=None
    ) -> Counter:
        return self._get("counter", name, description, unit, tag_keys, None)  # type: ignore[return-value]

    def gauge(
        self, name: str, description: str = "", unit: str = "", tag_keys: Iterable[str] = (), boundaries=None
    ) -> Gauge:
        return self._get("gauge", name, description, unit, tag_keys, None)  # type: ignore[return-value]

    def histogram(
        self,
        name: str,
        description: str = "",
        unit: str = "",
        tag_keys: Iterable[str] = (),
        boundaries: Sequence[float] | None = None,
    ) -> Histogram:
        return self._get("histogram", name, description, unit, tag_keys, boundaries)  # type: ignore[return-value]

    def from_spec(self, spec: MetricSpec) -> _Metric:
        return self._get(
            spec.type, spec.short_name, spec.description, spec.unit, spec.labels, spec.boundaries
        )

    def get(self, name: str) -> _Metric | None:
        """A created metric by exported or short name."""
        for kind in TYPES:
            m = self._metrics.get(self.full_name(name, kind))
            if m is not None:
                return m
        return None

    # -- exposition (prometheus backend)
    def start_http_server(self, port: int = 0, addr: str = "127.0.0.1") -> int | None:
        """Serve ``/metrics`` of this registry on ``addr:port`` (0 = a free port); returns the bound port.
        Under Ray returns None: Ray's metrics agent exports the metrics."""
        if self.backend != "prometheus":
            return None
        if self._http is not None:
            return self._http[0].server_address[1]
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        self._http = (server, thread)
        return server.server_address[1]

    def stop_http_server(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (prometheus backend)."""
        if self.backend != "prometheus":
            raise RuntimeError("exposition() needs the prometheus backend; Ray's metrics agent exports these")
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# ---------------------------------------------------------------------------------------------- tailspec
class TailspecMetrics:
    """Every metric of ``METRICS`` on one ``Metrics`` facade, with recording helpers.

    Metrics are attributes named by their short name: ``tm.accepted_tokens``, ``tm.step_phase_seconds``...
    """

    def __init__(
        self, metrics: Metrics | None = None, backend: str = "auto", specs: Sequence[MetricSpec] = METRICS
    ):
        self.metrics = metrics if metrics is not None else Metrics(backend=backend)
        self.specs = tuple(specs)
        self.by_name: dict[str, _Metric] = {}
        for spec in self.specs:
            m = self.metrics.from_spec(spec)
            self.by_name[spec.name] = m
            setattr(self, spec.short_name, m)

    @property
    def backend(self) -> str:
        return self.metrics.backend

    def start_http_server(self, port: int = 0, addr: str = "127.0.0.1") -> int | None:
        return self.metrics.start_http_server(port, addr)

    # -- per step (the pipeline)
    def record_step(self, row: Mapping[str, Any], *, spec: bool = True) -> None:
        """Record one ``metrics.jsonl`` row: ``step``, ``reward_mean``, the phase seconds
        (``rollout_seconds``, ``reward_seconds``, ``train_seconds``, ``weight_sync_seconds``), ``policy_version``,
        ``drafter_version``, per worker ``idle_seconds`` (bubble) and ``trained_seconds`` (from ``workers``), the
        tuner's decode steps per (bucket, arm) (``tuner.choices_by_bucket``), and with ``spec`` the per-drafter
        ``drafted`` / ``accepted`` totals and ``acceptance_lengths`` (tau -> verify steps) of ``drafters`` (leave
        ``spec=False`` when the rollout actors call ``record_spec`` themselves). Missing or None keys are
        skipped."""

        def num(key: str) -> float | None:
            v = row.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        if (v := num("step")) is not None:
            self.rl_step.set(v)
        if (v := num("reward_mean")) is not None:
            self.reward_mean.set(v)
        if (v := num("policy_version")) is not None:
            self.policy_version.set(v)
        if (v := num("drafter_version")) is not None:
            self.drafter_version.set(v)
        for key, phase in STEP_PHASE_KEYS.items():
            if (v := num(key)) is not None:
                self.observe_phase(phase, v)
        for w in row.get("workers") or ():
            worker = w.get("worker")
            if worker is None:
                continue
            self.add_bubble(worker, w.get("idle_seconds") or 0.0, w.get("trained_seconds") or 0.0)
        if spec:
            for drafter, c in (row.get("drafters") or {}).items():
                taus = [
                    float(t) for t, n in (c.get("acceptance_lengths") or {}).items() for _ in range(int(n))
                ]
                self.record_spec(drafter, c.get("drafted") or 0, c.get("accepted") or 0, taus)
        for bucket, arms in ((row.get("tuner") or {}).get("choices_by_bucket") or {}).items():
            for arm, n in arms.items():
                self.record_arm_selection(bucket, arm, n)

    def observe_phase(self, phase: str, seconds: float) -> None:
        self.step_phase_seconds.observe(max(0.0, float(seconds)), {"phase": phase})

    def record_responses(self, lengths: Iterable[int]) -> None:
        """One observation per finished response length (tokens)."""
        for n in lengths:
            self.response_length_tokens.observe(n)

    # -- speculative decoding (rollout actors)
    def record_spec(
        self, drafter: str, drafted: int, accepted: int, acceptance_lengths: Iterable[float] = ()
    ) -> None:
        """Drafted / accepted token counts of ``drafter`` and the acceptance lengths (tau per verify step)."""
        tags = {"drafter": drafter}
        self.drafted_tokens.inc(drafted, tags)
        self.accepted_tokens.inc(accepted, tags)
        for tau in acceptance_lengths:
            self.acceptance_length.observe(tau, tags)

    def set_active_batch_size(self, worker: str, n: int) -> None:
        self.active_batch_size.set(n, {"worker": worker})

    def record_arm_selection(self, bucket: str | int, arm: str, n: int = 1) -> None:
        self.tuner_arm_selections.inc(n, {"bucket": bucket, "arm": arm})

    # -- coordinator / spot trainer
    def set_worker_state(self, worker: str, state: str) -> None:
        """1 for ``state`` (a name of ``WORKER_STATES``; a ``WORKER_STATE_`` prefix is dropped), 0 for the rest."""
        state = str(state).upper().removeprefix("WORKER_STATE_")
        if state not in WORKER_STATES:
            raise ValueError(f"unknown worker state {state!r}; expected one of {WORKER_STATES}")
        for s in WORKER_STATES:
            self.worker_state.set(1.0 if s == state else 0.0, {"worker": worker, "state": s})

    def record_stream_drop(self, reason: str, n: int = 1) -> None:
        """``n`` hidden-state stream frames dropped for ``reason`` (``stream.DROP_REASONS``)."""
        self.stream_frames_dropped.inc(n, {"reason": reason})

    def add_bubble(self, worker: str, seconds: float, trained_seconds: float = 0.0) -> None:
        self.bubble_seconds.inc(max(0.0, float(seconds)), {"worker": worker})
        self.bubble_trained_seconds.inc(max(0.0, float(trained_seconds)), {"worker": worker})

    def set_versions(self, policy: int | None = None, drafter: int | None = None) -> None:
        if policy is not None:
            self.policy_version.set(policy)
        if drafter is not None:
            self.drafter_version.set(drafter)

    def init_series(
        self,
        workers: Iterable[str] = (),
        drafters: Iterable[str] = (),
        arm_buckets: Iterable[tuple[str, str]] = (),
        drop_reasons: Iterable[str] = (),
    ) -> None:
        """Create the run's labelled series at zero before step 1 (``Metric.touch``), so that ``increase()``
        over the first step counts it: per worker the bubble counters, per drafter
        the token counters and the acceptance-length histogram, every tuner (bucket, arm) pair, every step
        phase and the given stream drop reasons."""
        for w in workers:
            self.bubble_seconds.touch({"worker": w})
            self.bubble_trained_seconds.touch({"worker": w})
        for d in drafters:
            for metric in (self.drafted_tokens, self.accepted_tokens, self.acceptance_length):
                metric.touch({"drafter": d})
        for bucket, arm in arm_buckets:
            self.tuner_arm_selections.touch({"bucket": bucket, "arm": arm})
        for phase in STEP_PHASE_KEYS.values():
            self.step_phase_seconds.touch({"phase": phase})
        for reason in drop_reasons:
            self.stream_frames_dropped.touch({"reason": reason})


def bucket_label(lo: int, hi: int | None) -> str:
    """The ``bucket`` label of the tuner's batch-size bucket ``[lo, hi)``: ``'8-15'``, or ``'256+'`` (open)."""
    return f"{lo}-{hi - 1}" if hi else f"{lo}+"


def table_arm_buckets(table: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (bucket label, arm name) pair of a tuner strategy table (``BucketedBandit.table()``)."""
    return [(bucket_label(b["lo"], b.get("hi")), arm) for b in table["buckets"] for arm in table["arms"]]


# ---------------------------------------------------------------------------------- the process's metrics
_installed: TailspecMetrics | None = None  # the driver's (install_process_metrics)
_ray_own: TailspecMetrics | None = None  # a Ray worker's own, made on first use
_process_lock = threading.Lock()


def install_process_metrics(tm: TailspecMetrics | None) -> None:
    """Make ``tm`` (the driver's) the metrics of every service running in this process (``ray.use_ray=false``:
    the coordinator and rollout actors are plain objects in the driver's process, so their live metrics reach
    the driver's endpoint); None uninstalls it."""
    global _installed
    with _process_lock:
        _installed = tm


def installed_process_metrics() -> TailspecMetrics | None:
    """The ``TailspecMetrics`` installed with ``install_process_metrics`` (None: none)."""
    return _installed


def process_metrics(enabled: bool = True) -> TailspecMetrics | None:
    """The ``TailspecMetrics`` a service records live metrics to: None unless ``enabled``; the installed one
    (``install_process_metrics``); else, inside a Ray worker, one Ray-backed instance per process (exported by
    Ray's metrics agent); else None (no exporter in this process)."""
    global _ray_own
    if not enabled:
        return None
    with _process_lock:
        if _installed is not None:
            return _installed
        if not ray_active():
            return None
        if _ray_own is None:
            _ray_own = TailspecMetrics(backend="ray")
        return _ray_own


__all__ = [
    "BACKENDS",
    "METRICS",
    "STEP_PHASE_KEYS",
    "WORKER_STATES",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricSpec",
    "Metrics",
    "TailspecMetrics",
    "bucket_label",
    "docs_table",
    "install_process_metrics",
    "installed_process_metrics",
    "process_metrics",
    "ray_active",
    "table_arm_buckets",
]
