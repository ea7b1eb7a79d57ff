"""Speculation statistics over finished requests (kept apart from their sinks: metrics.jsonl, Prometheus).

Acceptance length tau = committed tokens per verify step = (accepted + 1) averaged over the verify steps
that had a non-empty draft (the "+1" is the bonus or correction token every verify step yields).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


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


def long_tail(
    step_log: Iterable, max_batch: int = LONG_TAIL_BATCH, cpu: bool = False
) -> dict[int, list[float]]:
    """The rollout's long-tail phase, where it spends its time once most responses have finished: per active
    batch size ``b <= max_batch``, ``[seconds, committed tokens]`` of its decode steps (``Engine.step_log``
    records; ``cpu``: their ``cpu_seconds`` instead of wall seconds)."""
    out: dict[int, list[float]] = {}
    for s in step_log:
        if s.batch_size <= max_batch:
            add_long_tail(out, {s.batch_size: ((s.cpu_seconds or 0.0) if cpu else s.seconds, s.committed)})
    return out


def add_long_tail(
    total: dict[int, list[float]], part: Mapping[int, Sequence[float]]
) -> dict[int, list[float]]:
    """``total`` with ``part``'s seconds and tokens added per batch size (in place; returned)."""
    for b, (sec, tok) in part.items():
        acc = total.setdefault(int(b), [0.0, 0])
        acc[0] += sec
        acc[1] += tok
    return total


def long_tail_speedup(
    plain: Mapping[int, Sequence[float]], spec: Mapping[int, Sequence[float]]
) -> float | None:
    """What speculation did to the long tail, at equal occupancy and work: plain's long-tail seconds over the
    seconds speculation takes for plain's tokens at its own seconds per token at each active batch size b,
    ``sum_b T_plain(b) / sum_b N_plain(b) * T_spec(b') / N_spec(b')`` (``long_tail`` dicts; keys may be str, as
    in JSON), b' = b where speculation decoded at b, else the nearest size it decoded at (ties: the smaller, whose
    seconds per token are the larger). None when either has no long-tail steps. A ratio of the phase's seconds,
    or of its tokens per second, would mix in how many requests were still running: a decode that finishes
    requests sooner enters the phase later with other work left (its tail can be nearly empty, or one straggler),
    and GRPO siblings that write the same response finish together, so the sizes decoded differ."""
    sp = {int(b): v for b, v in spec.items() if v[0] > 0 and v[1] > 0}
    pl = [(int(b), v) for b, v in plain.items() if v[1] > 0]
    if not sp or not pl:
        return None
    t_spec = 0.0
    for b, v in pl:
        q = sp[min(sp, key=lambda x: (abs(x - b), x))]
        t_spec += v[1] * q[0] / q[1]
    return sum(v[0] for _, v in pl) / t_spec
