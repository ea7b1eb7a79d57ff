"""Speculation statistics over finished requests (kept apart from their sinks: metrics.jsonl, Prometheus).

Acceptance length tau = committed tokens per verify step = (accepted + 1) averaged over the verify steps
that had a non-empty draft (the "+1" is the bonus or correction token every verify step yields).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def aggregate(outputs: Iterable) -> dict:
    """Sum ``RequestOutput.spec`` counters into step-level statistics.

    Returns drafted/accepted totals, ``verify_steps``, ``acceptance_length_mean`` (tau),
    ``acceptance_rate`` (accepted / drafted), ``acceptance_rate_by_position`` (index k: accepted at draft
    depth k+1 / verify steps that drafted that deep) and ``drafters`` (per drafter: drafted, accepted, rate,
    and ``acceptance_lengths``: verify steps per acceptance length tau = accepted + 1, keyed by tau as a string).
    """
    drafted = accepted = verify = 0
    by_pos_d: list[int] = []
    by_pos_a: list[int] = []
    per: dict[str, list[int]] = {}
    taus: dict[str, dict[int, int]] = {}
    for o in outputs:
        s = o.spec
        drafted += s.drafted
        accepted += s.accepted
        verify += s.verify_steps
        for k, (d, a) in enumerate(zip(s.drafted_by_position, s.accepted_by_position)):
            if k >= len(by_pos_d):
                by_pos_d.append(0)
                by_pos_a.append(0)
            by_pos_d[k] += d
            by_pos_a[k] += a
        for name, (d, a) in s.drafter_counts.items():
            c = per.setdefault(name, [0, 0])
            c[0] += d
            c[1] += a
        for name, counts in getattr(s, "tau_counts", {}).items():
            t = taus.setdefault(name, {})
            for tau, n in counts.items():
                t[tau] = t.get(tau, 0) + n
    return {
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "verify_steps": verify,
        "acceptance_length_mean": (accepted + verify) / verify if verify else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "acceptance_rate_by_position": [a / d if d else None for d, a in zip(by_pos_d, by_pos_a)],
        "drafters": {
            n: {
                "drafted": d,
                "accepted": a,
                "acceptance_rate": a / d if d else None,
                "acceptance_lengths": {str(k): v for k, v in sorted(taus.get(n, {}).items())},
            }
            for n, (d, a) in sorted(per.items())
        },
    }


def merge_drafters(rows: list[dict]) -> dict:
    """Totals per drafter over several steps' ``drafters`` objects."""
    tot: dict[str, list[int]] = {}
    for r in rows:
        for n, v in (r.get("drafters") or {}).items():
            c = tot.setdefault(n, [0, 0])
            c[0] += v["drafted"]
            c[1] += v["accepted"]
    return {
        n: {"drafted": d, "accepted": a, "acceptance_rate": a / d if d else None} for n, (d, a) in tot.items()
    }


LONG_TAIL_BATCH = 8  # a decode step with at most this many active requests belongs to the rollout's long tail


def long_tail_tokens(step_log: Iterable, max_batch: int = LONG_TAIL_BATCH) -> int:
    """Tokens a decode committed in its long-tail phase: the decode steps (``Engine.step_log`` records) with at
    most ``max_batch`` active requests, where a rollout spends its time once most responses have finished."""
    return sum(s.committed for s in step_log if s.batch_size <= max_batch)


def tail_seconds(step_log: Sequence, tokens: int, cpu: bool = False) -> float:
    """Seconds a decode took to commit its last ``tokens`` tokens: its steps' seconds from the end (CUDA-graph
    capture left out; ``cpu``: ``cpu_seconds`` instead of wall time), the step that crosses the count charged by
    its share of the tokens. All of the log's seconds when it committed fewer tokens."""
    left, total = tokens, 0.0
    for s in reversed(step_log):
        if left <= 0:
            break
        sec = (s.cpu_seconds or 0.0) if cpu else s.seconds - s.capture_seconds
        share = min(1.0, left / s.committed) if s.committed else 1.0
        total += share * sec
        left -= s.committed
    return total


def long_tail_speedup(
    plain_log: Sequence, spec_log: Sequence, max_batch: int = LONG_TAIL_BATCH, cpu: bool = False
) -> float | None:
    """What speculation did to the long tail: the seconds plain decoding took for the rollout's last N tokens
    over the seconds speculation took for its last N, N = ``long_tail_tokens(plain_log, max_batch)`` (the tokens
    plain commits with at most ``max_batch`` requests active). Both decodes commit the same responses (replayed
    samples), so this compares equal work at the end of the rollout; where every step is in the tail (max batch
    <= ``max_batch``) it is the ratio of the whole decodes. None when plain has no long-tail steps. Ratios of the
    phase's own seconds (or tokens/s) compare unequal work: a decode that finishes requests sooner enters the
    phase later with less left (its tail can be one straggler), so they swing with which requests are left."""
    return long_tail_totals([(plain_log, spec_log)], max_batch, cpu)["speedup"]


def long_tail_totals(
    pairs: Iterable[tuple[Sequence, Sequence]], max_batch: int = LONG_TAIL_BATCH, cpu: bool = False
) -> dict:
    """``long_tail_speedup``'s terms summed over (plain step log, speculative step log) pairs of the same
    samples: ``tokens`` (N per pair), ``plain_seconds``, ``spec_seconds`` (each decode's seconds for its last N;
    ``cpu``: CPU seconds), ``speedup`` (plain over spec seconds; None when no pair reached the tail),
    ``spec_strategies`` (the speculative decodes' steps with at most ``max_batch`` active requests, per strategy:
    what the tail played) and ``spec_tail_tau`` (those steps' committed tokens per request and step: tau over
    the tail's drafted and plain steps alike; None without such steps)."""
    out = {"tokens": 0, "plain_seconds": 0.0, "spec_seconds": 0.0}
    strategies: dict[str, int] = {}
    committed = request_steps = 0
    for plain, spec in pairs:
        out["tokens"] += (n := long_tail_tokens(plain, max_batch))
        out["plain_seconds"] += tail_seconds(plain, n, cpu)
        out["spec_seconds"] += tail_seconds(spec, n, cpu)
        for s in spec:
            if s.batch_size <= max_batch:
                strategies[s.strategy] = strategies.get(s.strategy, 0) + 1
                committed, request_steps = committed + s.committed, request_steps + s.batch_size
    out["spec_strategies"] = dict(sorted(strategies.items(), key=lambda kv: -kv[1]))
    out["spec_tail_tau"] = committed / request_steps if request_steps else None
    out["speedup"] = out["plain_seconds"] / out["spec_seconds"] if out["spec_seconds"] > 0 else None
    return out
