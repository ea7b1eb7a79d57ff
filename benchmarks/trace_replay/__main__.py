"""Trace-replay benchmark: speculative decoding on real sampled reasoning rollouts, at real model shapes.

Run from the repository root::

    python -m benchmarks.trace_replay [--quick] [--shapes tiny,qwen2.5-0.5b] [--batches 1,8,32,128]
                                      [--device cpu|cuda] [--problems 40] [--warm-problems 10] [--rounds 3]
                                      [--arms suffix-k8,...] [--warm-passes 3] [--warm-ups 1]

For each shape (``services/rollout_actor/shapes.py``: the embedded ``tiny`` policy, or Qwen2.5 / Llama-3.1
sizes with random weights) and max batch size (continuous batching), the engine replays the recorded responses
of ``data/traces/qwen25-math-math-cot`` (``workload.py``: epoch 0 = history, epoch 1 measured, 4 responses per
problem submitted together) under plain decoding, every fixed deterministic drafter arm, the adaptive tuner
(warmed up on the next ``--warm-problems`` problems of the file and the history epoch: ``runner.py``; with
``--warm-ups N``, N tuners each warmed up on its own, the headline's adaptive figures their mean), and
``plain-again`` (the A/A control), all in this one process, in rounds: on CPU each round decodes every
configuration in lock step (side by side, one engine step each in a shuffled order, each charged its own
steps' seconds: ``ReplayBench.run_lockstep``), so all see the machine's speed of the same moments; on CUDA
(one engine and graph pool) or with ``--sequential``, one configuration after another, in the order rotated by
the round (ABC, BCA, ...). Every output is checked to equal its trace.

Reported per configuration (``report.py``): makespan (s), the long tail (the seconds for the rollout's last N
tokens, N = the tokens plain decoding commits with <= 8 active requests), tau (``1 + accepted / verify steps``
over drafted steps), acceptance by draft position, speedups vs plain (paired per round, median), and a step's
milliseconds with <= 8 active requests split into drafting, the target forward and the engine's own work (verify
batch, acceptance rule, commit; on CUDA the forward is its launch, the kernels' time lands in the rest).
``headline``: one entry per (device, shape, batch). Writes ``benchmarks/results/trace_replay.{json,md,png}``
(``--out-dir``, ``--name``), rewritten after every (shape, batch) so a long run keeps what it measured.

``--quick``: the ``tiny`` shape on CPU, 8 problems (8 others to warm up: their rollouts reach the measured
run's batch sizes, as a long run's earlier steps do), max batch 8 and 32, the arms ``QUICK_ARMS``, 2 rounds
(~5 min on an idle 2-core machine). Batch 1 is left out there: it decodes all 16k tokens one step
at a time in each of ~12 runs.
``--device cuda``: default shapes Qwen2.5-1.5B and Qwen2.5-7B in bf16 (the engine replays CUDA graphs). No Ray
is imported (the engine, drafters and tuner policy run in this process).
``--problems`` may list one count per max batch size (``--batches 8,128 --problems 8,32``): a large batch needs
enough requests to fill it, a small one runs long on many.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from benchmarks.machine import describe_machine
from benchmarks.trace_replay import report, workload
from benchmarks.trace_replay.runner import NOT_REPLAYABLE, ReplayBench, all_configs
from services.rollout_actor.shapes import SHAPES, build_model, load_tokenizer, shape_config

REPO = Path(__file__).resolve().parents[2]
OUT_DIR = REPO / "benchmarks" / "results"
QUICK_ARMS = ("suffix-k8", "suffix-k16", "ngram-k3")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="tiny shape, 8 problems, batches 8,32, 3 arms, 2 rounds"
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--shapes", type=_names, default=None, help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--batches", type=_ints, default=None, help="max batch sizes (default 1,8,32,128)")
    ap.add_argument(
        "--problems",
        type=_ints,
        default=None,
        help="measure the first N problems (default 40); a comma list gives one N per --batches entry",
    )
    ap.add_argument(
        "--warm-problems", type=int, default=None, help="the next N problems warm the tuner up (default 10)"
    )
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument("--arms", type=_names, default=None, help="fixed arms (default: all of FIXED_ARMS)")
    ap.add_argument(
        "--warm-passes",
        type=int,
        default=3,
        help="passes over the warm-up problems (a long run's tuner has seen many steps; one pass leaves its "
        "large-batch buckets unsettled)",
    )
    ap.add_argument(
        "--warm-ups",
        type=int,
        default=1,
        help="adaptive tuners, each warmed up on its own and measured side by side (adaptive, adaptive-2, ...); "
        "the headline's adaptive figures are their mean",
    )
    ap.add_argument(
        "--sequential",
        action="store_true",
        help="on CPU too, run each configuration alone, one after another (the default on CUDA)",
    )
    ap.add_argument(
        "--history-from-trace",
        action="store_true",
        help="put the history epoch into the suffix drafter from the trace instead of decoding it (the tuner "
        "then warms up on --warm-problems alone): for large batches whose history holds a very long response",
    )
    ap.add_argument("--longtail-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR)
    ap.add_argument("--name", default="trace_replay", help="output file stem")
    a = ap.parse_args(argv)
    if a.device not in ("cpu", "cuda"):
        ap.error("--device must be cpu or cuda")
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    default_shapes = ["qwen2.5-1.5b", "qwen2.5-7b"] if a.device == "cuda" else ["tiny"]
    a.shapes = a.shapes or (["tiny"] if a.quick else default_shapes)
    bad = [s for s in a.shapes if s not in SHAPES]
    if bad:
        ap.error(f"unknown shape(s) {bad}; known: {', '.join(SHAPES)}")
    a.batches = a.batches or ([8, 32] if a.quick else [1, 8, 32, 128])
    a.problems = a.problems or [8 if a.quick else 40]
    if len(a.problems) == 1:
        a.problems = a.problems * len(a.batches)
    if len(a.problems) != len(a.batches):
        ap.error(f"--problems lists {len(a.problems)} counts for {len(a.batches)} --batches")
    if a.warm_problems is None:
        a.warm_problems = 8 if a.quick else 10
    if (
        min(a.problems) < 1
        or a.warm_problems < 0
        or max(a.problems) + a.warm_problems > workload.NUM_PROBLEMS
    ):
        ap.error(f"--problems + --warm-problems must be <= {workload.NUM_PROBLEMS} (and --problems >= 1)")
    a.rounds = a.rounds or (2 if a.quick else 3)
    a.arms = a.arms or (list(QUICK_ARMS) if a.quick else None)
    try:
        a.configs = all_configs(a.arms, a.warm_ups)
    except ValueError as e:
        ap.error(str(e))
    return a


def device_name(device: str) -> str:
    """``cpu`` or the GPU's name."""
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark (``parse_args``), write the outputs, return the result dict."""
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dev_name = device_name(args.device)
    all_rows = workload.load_rows(problems=max(args.problems) + args.warm_problems)
    result: dict = {
        "device": dev_name,
        "machine": describe_machine(),
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("out_dir",) and not isinstance(v, Path)
        },
        "workload": {
            "traces": str(workload.TRACES.relative_to(REPO)),
            "problems": dict(zip(args.batches, args.problems)),
            "warm_problems": args.warm_problems,
            "warm_passes": args.warm_passes,
            "group": workload.GROUP,
            "history_epoch": workload.HISTORY_EPOCH,
            "measured_epoch": workload.MEASURED_EPOCH,
            "sampling": workload.SAMPLING,
            "prompt_template": workload.format_prompt("{system}", "{question}"),
            "order": "submission order, problem-major (siblings consecutive)",
        },
        "skipped": NOT_REPLAYABLE,
        "results": [],
        "headline": [],
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    for shape in args.shapes:
        cfg = shape_config(shape)
        t = time.perf_counter()
        model = build_model(shape, args.device, seed=args.seed)
        tok = load_tokenizer(shape)
        tokenized = workload.tokenize(all_rows, tok, cfg.vocab_size, cfg.eos_ids())
        print(
            f"[trace_replay] {shape} on {dev_name}: {model.num_parameters() / 1e6:.1f}M params, "
            f"{next(model.parameters()).dtype}, built in {time.perf_counter() - t:.1f}s",
            flush=True,
        )
        for batch, n in zip(args.batches, args.problems):
            problems = tokenized[:n]
            warm_problems = tokenized[n : n + args.warm_problems]
            desc = workload.describe(problems, workload.MEASURED_EPOCH)
            print(
                f"[trace_replay]   b={batch}: measured epoch {desc['requests']} requests, "
                f"{desc['response_tokens']} tokens (max {desc['response_tokens_max']})",
                flush=True,
            )
            bench = ReplayBench(model, problems, batch, args.longtail_batch, args.seed, warm_problems)
            warm = bench.warm(args.warm_passes, not args.history_from_trace, args.warm_ups)
            tuner = {"after_warm_up": bench.tuner_snapshot()}
            history = (
                f"exact history {warm['exact']}/{warm['history_requests']}"
                if warm["history_decoded"]
                else "history epoch from the trace, not decoded"
            )
            print(
                f"[trace_replay]   b={batch}: warm-up (the history epoch, then {warm['warm_problems']} other "
                f"problems x {warm['passes']}; {warm['warm_ups']} warm-up(s)) {warm['seconds']:.1f}s, {history}",
                flush=True,
            )
            runs = []
            lockstep = args.device == "cpu" and not args.sequential
            for rep in range(args.rounds):
                k = rep % len(args.configs)
                order = args.configs[k:] + args.configs[:k]
                done = bench.run_lockstep(order, rep) if lockstep else (bench.run(c, rep) for c in order)
                for r in done:
                    runs.append(r)
                    print(
                        f"[trace_replay]   b={batch} round {rep} {r.config:>20}: makespan {r.makespan_s:7.3f}s "
                        f"long-tail {r.longtail_s:7.3f}s tau {report._f(r.tau)} exact {r.exact}/{r.requests}",
                        flush=True,
                    )
            summary = report.summarize(runs, args.configs)
            tuner["after_rounds"] = bench.tuner_snapshot()
            head = report.headline(dev_name, shape, batch, summary)
            result["results"].append(
                {
                    "shape": shape,
                    "batch": batch,
                    "params": model.num_parameters(),
                    "dtype": str(next(model.parameters()).dtype),
                    "max_seq_len": bench.engine.max_seq_len,
                    "workload": desc,
                    "warm": warm,
                    "tuner": tuner,  # the adaptive policy's table per bucket (ReplayBench.tuner_snapshot)
                    "summary": summary,
                    "runs": [r.to_dict() for r in runs],
                }
            )
            result["headline"].append(head)
            print(f"[trace_replay]   headline {json.dumps(head)}", flush=True)
            del bench
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            write(result, args)
        del model
        gc.collect()
    result["seconds"] = time.perf_counter() - t_all
    write(result, args, plot=True)
    return result


def write(result: dict, args: argparse.Namespace, plot: bool = False) -> None:
    stem = args.out_dir / args.name
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    report.write_markdown(result, Path(f"{stem}.md"))
    if plot:
        report.write_plot(result, Path(f"{stem}.png"))
        print(f"[trace_replay] wrote {stem}.json, .md, .png ({result['seconds']:.0f}s)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    return run(parse_args(argv))


if __name__ == "__main__":
    main()
