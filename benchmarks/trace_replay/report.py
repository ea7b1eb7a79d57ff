"""Trace-replay results: per (shape, batch) summaries, the headline, markdown and the plot.

Speedups are paired: in each round, plain's value over the configuration's, then the median over rounds. In
replay every configuration decodes the same tokens, so the makespan ratio compares the same work; the long-tail
speedup compares each run's seconds for the rollout's last N tokens, N = the tokens plain decoding commits with
<= ``longtail_batch`` active requests (``services.rollout_actor.speculative.stats.long_tail_speedup``): equal
work, where the phase's own seconds would not be (a configuration that finishes some requests sooner enters that
phase later, with less left).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from benchmarks.trace_replay.runner import FIXED_ARMS, PLAIN, PLAIN_AGAIN, ReplayRun, adaptive_index

HEADLINE_KEYS = (
    "device",
    "shape",
    "batch",
    "long_tail_speedup_best_fixed",
    "long_tail_speedup_adaptive",
    "makespan_speedup_adaptive",
    "tau_best",
    "best_fixed_arm",
)
MS_PARTS = ("draft", "forward", "rest")  # of a long-tail step's milliseconds (``_step_ms``)


def _median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: Sequence[ReplayRun], configs: Sequence[str]) -> dict:
    """Per configuration: medians over rounds (makespan, long-tail seconds / tokens / CPU seconds), paired
    speedups vs plain (makespan; the long tail by wall and by CPU time), tau and acceptance by draft position
    pooled over rounds, replay exactness; plus the A/A control (plain / plain-again per round)."""
    plain = {r.rep: r for r in runs if r.config == PLAIN}
    out: dict[str, dict] = {}
    for c in configs:
        rs = [r for r in runs if r.config == c]
        if not rs:
            continue
        pairs = [(plain[r.rep], r) for r in rs if r.rep in plain]
        acc = (
            [sum(x) for x in zip(*[r.accepted_by_position for r in rs])] if rs[0].accepted_by_position else []
        )
        dra = [sum(x) for x in zip(*[r.drafted_by_position for r in rs])] if rs[0].drafted_by_position else []
        verify, accepted = sum(r.verify_steps for r in rs), sum(r.accepted for r in rs)
        strategies = sum((Counter(r.strategies) for r in rs), Counter())
        out[c] = {
            "rounds": len(rs),
            "makespan_s": _median([r.makespan_s for r in rs]),
            "cpu_s": _median([r.cpu_s for r in rs]),
            "longtail_s": _median([r.longtail_s for r in rs]),
            "longtail_tokens": _median([r.longtail_tokens for r in rs]),
            "phase_steps": _median([r.phase_steps for r in rs]),
            "tokens": rs[0].tokens,
            "steps": _median([r.steps for r in rs]),
            "makespan_speedup": _median([p.makespan_s / r.makespan_s for p, r in pairs if r.makespan_s > 0]),
            "longtail_speedup": _median(
                lt := [p.longtail_s / r.longtail_s for p, r in pairs if r.longtail_s > 0]
            ),
            # the round-to-round range: the lock step's A/A compares identical decodes in the same moments, while
            # a configuration's last N tokens fall in other moments than plain's (a short, noisy window)
            "longtail_speedup_range": [min(lt), max(lt)] if lt else None,
            "longtail_cpu_speedup": _median(
                [p.longtail_cpu_s / r.longtail_cpu_s for p, r in pairs if r.longtail_cpu_s > 0]
            ),
            "tau": 1 + accepted / verify if verify else None,
            "draft_rate": verify / max(1, sum(r.tokens for r in rs)),
            "acceptance_by_position": [a / d if d else None for a, d in zip(acc, dra)],
            "exact_fraction": min(r.exact / r.requests for r in rs),
            "capture_s": sum(r.capture_s for r in rs),
            "longtail_step_ms": _step_ms(rs),
            "eager_forwards": None if rs[0].eager_forwards is None else sum(r.eager_forwards for r in rs),
        }
        if strategies:
            out[c]["strategies"] = dict(strategies.most_common())
        out[c]["by_batch"] = _by_batch(rs)
    base = out.get(PLAIN, {}).get("by_batch", {})
    for d in out.values():
        for label, row in d["by_batch"].items():
            rate = base.get(label, {}).get("tokens_per_s")
            row["vs_plain"] = row["tokens_per_s"] / rate if rate and row["tokens_per_s"] else None
    aa = [p.makespan_s / r.makespan_s for r in runs if r.config == PLAIN_AGAIN and (p := plain.get(r.rep))]
    aa_lt = [
        p.longtail_s / r.longtail_s
        for r in runs
        if r.config == PLAIN_AGAIN and (p := plain.get(r.rep)) and r.longtail_s > 0
    ]
    return {
        "configs": out,
        "aa": {
            "makespan_ratios": aa,
            "longtail_ratios": aa_lt,
            "spread": max((abs(1 - x) for x in aa + aa_lt), default=None),
        },
    }


def _by_batch(rs: Sequence[ReplayRun]) -> dict:
    """Per active batch size bucket, the rounds pooled: ``steps`` (per round), ``tokens_per_s`` (committed tokens
    over seconds) and ``strategies`` (steps per strategy, most played first)."""
    out: dict[str, dict] = {}
    for r in rs:
        for label, (steps, tokens, seconds, strategies) in r.by_batch.items():
            row = out.setdefault(label, {"steps": 0, "tokens": 0, "seconds": 0.0, "strategies": Counter()})
            row["steps"] += steps / len(rs)
            row["tokens"] += tokens
            row["seconds"] += seconds
            row["strategies"].update(strategies)
    for row in out.values():
        row["tokens_per_s"] = row.pop("tokens") / row["seconds"] if row["seconds"] > 0 else None
        row["strategies"] = dict(row["strategies"].most_common())
    return out


def _step_ms(rs: Sequence[ReplayRun]) -> dict | None:
    """A long-tail decode step's mean milliseconds (medians over rounds): ``step``, of which ``draft``
    (proposing), ``forward`` (the target forward) and ``rest`` (building the verify batch, the acceptance rule,
    committing, the drafters' ``observe``: the engine's own work per step)."""
    rs = [r for r in rs if r.phase_steps > 0]
    if not rs:
        return None
    out = {
        k: _median([1e3 * getattr(r, a) / r.phase_steps for r in rs])
        for k, a in (("step", "phase_s"), ("draft", "phase_draft_s"), ("forward", "phase_forward_s"))
    }
    out["rest"] = out["step"] - out["draft"] - out["forward"]
    return out


def _mean(xs: Sequence[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _adaptive(cs: dict) -> dict:
    """The adaptive policy's figures over its warm-ups (``adaptive``, ``adaptive-2``, ...): each speedup the mean
    of the warm-ups' (each a median over rounds), its range over every run of every warm-up, and per warm-up its
    long-tail and makespan speedups."""
    ads = [cs[c] for c in cs if adaptive_index(c) is not None]
    ranges = [d["longtail_speedup_range"] for d in ads if d.get("longtail_speedup_range")]
    out = {
        k: _mean([d[k] for d in ads])
        for k in ("longtail_speedup", "makespan_speedup", "longtail_cpu_speedup")
    }
    out["longtail_speedup_range"] = [min(r[0] for r in ranges), max(r[1] for r in ranges)] if ranges else None
    out["warm_ups"] = [[d["longtail_speedup"], d["makespan_speedup"]] for d in ads]
    return out


def headline(device: str, shape: str, batch: int, summary: dict) -> dict:
    """The headline entry (``HEADLINE_KEYS``, plus the CPU-time speedups, the A/A spread and the fraction of
    outputs equal to their trace): the best fixed arm by long-tail speedup, its speedup and tau
    (``tau_best``), and the adaptive policy's long-tail and makespan speedups (``_adaptive``: the mean over its
    warm-ups, ``adaptive_warm_ups`` each warm-up's pair); ``adaptive_vs_best_fixed``: the adaptive policy's
    long-tail speedup over the best fixed arm's, and its makespan speedup over the highest fixed arm's."""
    cs = summary["configs"]
    fixed = [c for c in cs if c in FIXED_ARMS and cs[c]["longtail_speedup"] is not None]
    best = max(fixed, key=lambda c: cs[c]["longtail_speedup"]) if fixed else None
    ad = _adaptive(cs)
    best_makespan = max((cs[c]["makespan_speedup"] for c in fixed), default=None)
    best_tail = cs[best]["longtail_speedup"] if best else None
    vs = {
        "long_tail": ad["longtail_speedup"] / best_tail if ad["longtail_speedup"] and best_tail else None,
        "makespan": ad["makespan_speedup"] / best_makespan
        if ad["makespan_speedup"] and best_makespan
        else None,
    }
    return {
        "device": device,
        "shape": shape,
        "batch": batch,
        "long_tail_speedup_best_fixed": cs[best]["longtail_speedup"] if best else None,
        "long_tail_speedup_adaptive": ad.get("longtail_speedup"),
        "makespan_speedup_adaptive": ad.get("makespan_speedup"),
        "tau_best": cs[best]["tau"] if best else None,
        "best_fixed_arm": best,
        # the same speedups in CPU time (steadier than wall time on a shared CPU; ~wall time on a GPU)
        "long_tail_cpu_speedup_best_fixed": cs[best]["longtail_cpu_speedup"] if best else None,
        "long_tail_cpu_speedup_adaptive": ad.get("longtail_cpu_speedup"),
        "long_tail_speedup_range_best_fixed": cs[best]["longtail_speedup_range"] if best else None,
        "long_tail_speedup_range_adaptive": ad.get("longtail_speedup_range"),
        "adaptive_warm_ups": ad["warm_ups"],
        "adaptive_vs_best_fixed": vs,
        "aa_spread": summary["aa"]["spread"],
        "exact_fraction": min((c["exact_fraction"] for c in cs.values()), default=None),
    }


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _range(r) -> str:
    """`` (lo-hi)`` of a speedup's range over rounds; empty with one round or none."""
    return "" if not r or r[0] == r[1] else f" ({r[0]:.2f}-{r[1]:.2f})"


def _warm_ups(settings: dict) -> str:
    """The markdown's sentence on several warm-ups (``--warm-ups``); empty for one."""
    n = settings.get("warm_ups", 1)
    if n <= 1:
        return ""
    return (
        f"adaptive = the mean over {n} tuners, each warmed up on its own and measured side by side with the "
        "others (`adaptive`, `adaptive-2`, ...: one warm-up is one draw of what it leaves in the buckets few "
        "steps reach); its range covers every run of every warm-up. "
    )


def _vs_best(h: dict) -> str:
    """``adaptive_vs_best_fixed``'s two ratios, then each warm-up's in brackets (several warm-ups only)."""
    vs = h.get("adaptive_vs_best_fixed") or {}
    text = f"{_f(vs.get('long_tail'), '{:.3f}')}, {_f(vs.get('makespan'), '{:.3f}')}"
    ups, lt = h.get("adaptive_warm_ups") or [], h.get("long_tail_speedup_best_fixed")
    if len(ups) > 1 and lt:
        text += (
            " (long tail per warm-up: "
            + " / ".join(_f(u[0] / lt if u[0] else None, "{:.3f}") for u in ups)
            + ")"
        )
    return text


def _machine(result: dict) -> str:
    m = result.get("machine") or {}
    if result["device"] != "cpu" or not m:
        return ""
    return f" ({m.get('cpu_model')}, load average {m.get('load_average_1_5_15')} at the start)"


def _problems(w: dict) -> str:
    """``workload.problems``: one count, or one per max batch size."""
    p = w["problems"]
    if not isinstance(p, dict):
        return f"{p} problems"
    if len(set(p.values())) == 1:
        return f"{next(iter(p.values()))} problems"
    return "problems per max batch size " + ", ".join(f"{n} (b={b})" for b, n in p.items())


def _rounds(settings: dict) -> str:
    """How a round ran its configurations (``__main__``: lock step on CPU unless ``--sequential``)."""
    if settings.get("device") == "cpu" and not settings.get("sequential"):
        return "lock-step rounds (every configuration side by side, one engine step each in turn)"
    return "interleaved rounds (configurations one after another, the order rotated per round)"


def write_markdown(result: dict, path: Path) -> str:
    """The headline table and, per (shape, batch), every configuration's row. Returns the text."""
    w = result["workload"]
    lines = [
        "## Trace replay (`python -m benchmarks.trace_replay`)",
        "",
        f"Real Qwen2.5-Math MATH rollouts replayed token for token (`GenerationRequest.reference`) on model shapes "
        f"with random weights: {_problems(w)}, epoch {w['measured_epoch']} measured ({w['group']} "
        f"responses per problem, all submitted together), epoch {w['history_epoch']} as history"
        + (
            " (put into the suffix drafter from the trace, not decoded); the adaptive tuner warmed up on "
            if result["settings"].get("history_from_trace")
            else "; the adaptive tuner warmed up on the history epoch, then "
        )
        + f"{w.get('warm_problems', 0)} other problems ({w.get('warm_passes', 1)} passes: their history epoch "
        "into the drafter from the trace, their measured epoch decoded, drafting with a history as every RL step "
        "after the first); "
        f"{result['settings']['rounds']} {_rounds(result['settings'])}; long tail = the rollout's last N tokens, N = those "
        f"plain decoding commits with <= {result['settings']['longtail_batch']} active requests (equal work for "
        "every configuration). Speedups: paired medians vs plain; "
        "A/A = |1 - plain/plain-again|, largest over rounds (wall time; CPU-time ratios are steadier on a shared "
        "CPU); (lo-hi): a long-tail speedup's range over rounds (a configuration's long tail falls in other "
        "moments than plain's: the run-to-run spread, which the A/A does not show). tau (best) = the best fixed "
        "arm's. "
        + _warm_ups(result["settings"])
        + "adaptive / best fixed: the adaptive long-tail speedup over the best fixed arm's, and its makespan "
        "speedup over the highest fixed arm's. Device: "
        f"{result['device']}{_machine(result)}."
        + (" `--quick` run." if result["settings"].get("quick") else ""),
        "",
        "| shape | batch | best fixed arm | long-tail x (best fixed) | long-tail x (adaptive) "
        "| makespan x (adaptive) | adaptive / best fixed: long tail, makespan "
        "| long-tail CPU x (best fixed / adaptive) | tau (best) | A/A spread | replay exact |",
        "|---|---:|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for h in result["headline"]:
        lines.append(
            f"| {h['shape']} | {h['batch']} | {h['best_fixed_arm'] or '-'} "
            f"| {_f(h['long_tail_speedup_best_fixed'])}{_range(h.get('long_tail_speedup_range_best_fixed'))} "
            f"| {_f(h['long_tail_speedup_adaptive'])}{_range(h.get('long_tail_speedup_range_adaptive'))} "
            f"| {_f(h['makespan_speedup_adaptive'])} | {_vs_best(h)} "
            f"| {_f(h.get('long_tail_cpu_speedup_best_fixed'))} / "
            f"{_f(h.get('long_tail_cpu_speedup_adaptive'))} | {_f(h['tau_best'])} | {_f(h['aa_spread'], '{:.3f}')} "
            f"| {_f(h['exact_fraction'], '{:.0%}')} |"
        )
    for blk in result["results"]:
        n_tail = blk["summary"]["configs"].get(PLAIN, {}).get("longtail_tokens")
        lines += [
            "",
            f"### {blk['shape']}, max batch {blk['batch']} ({blk['workload']['requests']} requests, "
            f"{blk['workload']['response_tokens']} response tokens)",
            "",
            f"| config | makespan s | x | last {_f(n_tail, '{:.0f}')} "
            "tokens s | long-tail x | long-tail CPU x | tau "
            f"| acceptance by position (1..4) | step ms with <= {result['settings']['longtail_batch']} active: "
            "draft + forward + rest | eager forwards (CUDA graphs) |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
        ]
        for c, d in blk["summary"]["configs"].items():
            acc = " ".join(_f(a) for a in d["acceptance_by_position"][:4]) or "-"
            ms = d.get("longtail_step_ms")
            ms = "-" if not ms else f"{ms['step']:.2f}: " + " + ".join(f"{ms[k]:.2f}" for k in MS_PARTS)
            lines.append(
                f"| {c} | {_f(d['makespan_s'], '{:.3f}')} | {_f(d['makespan_speedup'])} "
                f"| {_f(d['longtail_s'], '{:.3f}')} | {_f(d['longtail_speedup'])}"
                f"{_range(d.get('longtail_speedup_range'))} "
                f"| {_f(d['longtail_cpu_speedup'])} | {_f(d['tau'])} | {acc} | {ms} "
                f"| {_f(d.get('eager_forwards'), '{:d}')} |"
            )
        for c, d in blk["summary"]["configs"].items():
            if adaptive_index(c) is not None and d.get("strategies"):
                played = ", ".join(f"{k} {v}" for k, v in d["strategies"].items())
                lines += ["", f"Decode steps per arm, `{c}`: {played}"]
        lines += _by_batch_table(blk["summary"]["configs"])
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _by_batch_table(cs: dict) -> list[str]:
    """Markdown: each configuration's throughput by active batch size bucket as a multiple of plain's there,
    and the strategy each adaptive warm-up played most in each bucket (with its share of the bucket's steps)."""
    labels = list(cs.get(PLAIN, {}).get("by_batch", {}))
    if not labels:
        return []
    lines = [
        "",
        "Throughput by active batch size (committed tokens/s over all rounds, as a multiple of plain's in the same "
        "bucket; the bucket's batch sizes pooled), and the steps per round in each bucket:",
        "",
        "| config | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    steps = cs[PLAIN]["by_batch"]
    lines.append("| plain: steps | " + " | ".join(f"{steps[b]['steps']:.0f}" for b in labels) + " |")
    for c, d in cs.items():
        if c in (PLAIN, PLAIN_AGAIN):
            continue
        row = d.get("by_batch", {})
        lines.append(f"| {c} | " + " | ".join(_f(row.get(b, {}).get("vs_plain")) for b in labels) + " |")
    for c in (c for c in cs if adaptive_index(c) is not None and cs[c].get("by_batch")):
        most = []
        for b in labels:
            st = cs[c]["by_batch"].get(b, {}).get("strategies") or {}
            k = next(iter(st), None)
            most.append("-" if k is None else f"{k} ({st[k] / sum(st.values()):.0%})")
        lines.append(f"| {c}: most played | " + " | ".join(most) + " |")
    return lines


def write_plot(result: dict, path: Path) -> None:
    """One row per shape: long-tail and makespan speedup vs plain by max batch size, a bar per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(b["shape"] for b in result["results"]))
    configs = [c for c in result["settings"]["configs"] if c != PLAIN]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(14, 4.2 * len(shapes)), squeeze=False)
    cmap = plt.get_cmap("tab10")
    width = 0.8 / max(1, len(configs))
    for row, shape in zip(axes, shapes):
        blks = [b for b in result["results"] if b["shape"] == shape]
        for ax, key, title in (
            (row[0], "longtail_speedup", "long-tail (the last tokens)"),
            (row[1], "makespan_speedup", "makespan"),
        ):
            for i, c in enumerate(configs):
                ys = [b["summary"]["configs"].get(c, {}).get(key) for b in blks]
                xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(blks))]
                pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
                ax.bar([p[0] for p in pts], [p[1] for p in pts], width, label=c, color=cmap(i % 10))
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks(range(len(blks)), [f"b={b['batch']}" for b in blks])
            ax.set_ylabel("x vs plain")
            ax.set_title(f"{shape}: {title} speedup")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 9), fontsize=8, frameon=False)
    fig.suptitle(f"Trace replay ({result['device']})")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m benchmarks.trace_replay.report RESULT.json ...``: rebuild each JSON's markdown and plot beside it
    (e.g. for a GPU run whose machine sent back only the JSON)."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=main.__doc__.split(":", 1)[1].strip())
    ap.add_argument("json", nargs="+", type=Path)
    for path in ap.parse_args(argv).json:
        result = json.loads(path.read_text())
        write_markdown(result, path.with_suffix(".md"))
        write_plot(result, path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.md')} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
