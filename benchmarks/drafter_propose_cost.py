"""Cost of one ``propose`` call for 64 running requests: suffix-tree drafter vs n-gram drafter.

Run from the repository root::

    python -m benchmarks.drafter_propose_cost [--target-forward-ms 3.2] [--requests 64] [--steps 200]

Workload (no model needed): GSM8K train questions/answers tokenized crudely (regex pieces: words, single
digits, punctuation, whitespace runs -> ids). A response is the answer plus EOS; a "GRPO sibling" is the
answer with ~8% of its tokens replaced by other tokens of the same answer. History: ``--history-problems``
problems x ``--group`` finished siblings (a few hundred responses) fed through ``start_request`` /
``finish_request``. Then ``--requests`` requests run side by side, 3/4 of them on problems with history,
with contexts of up to ``--context`` tokens (~250 on average: GSM8K question + partial answer). Each
simulated decode step (1) times ``propose`` of each drafter for all requests (budget ``--budget`` draft
tokens, chain), (2) commits the greedily accepted prefix of the suffix draft plus one token of the
request's true continuation and calls ``observe``; a finished request calls ``finish_request`` and
``flush`` (indexing it into the problem and global tries at once; in a rollout the engine's decode thread
only queues it, siblings' responses are indexed at their problem's next propose, the rest after the
rollout) and is replaced by a new one. Reported: median and p90
wall and CPU time per ``propose`` call (all requests), per request, the mean draft length and the mean
accepted length per step against the true continuation (greedy check), the cost of ``observe`` and
``finish_request``, trie sizes, and, with ``--target-forward-ms``, propose / forward.

Writes ``benchmarks/results/drafter_propose_cost.json`` with the machine described.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.machine import cpu_model
from services.rollout_actor.speculative.base import Drafter, DraftRequest
from services.rollout_actor.speculative.ngram import NgramDrafter
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / "data" / "gsm8k" / "train.jsonl"
OUT = REPO / "benchmarks" / "results" / "drafter_propose_cost.json"
_PIECE = re.compile(r"\d|[A-Za-z]+|\s+|[^\sA-Za-z\d]")


class CrudeTokenizer:
    """Regex pieces -> ids (0 = EOS); a stand-in for a BPE tokenizer with roughly its granularity."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {"<eos>": 0}

    def encode(self, text: str) -> list[int]:
        v = self.vocab
        return [v.setdefault(p, len(v)) for p in _PIECE.findall(text)]


def load_examples(path: Path, limit: int) -> list[tuple[str, str]]:
    rows = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            rows.append((d["question"], d["answer"]))
            if len(rows) >= limit:
                break
    return rows


def sibling(answer: list[int], rng: random.Random, rate: float = 0.08) -> list[int]:
    out = list(answer)
    for i in range(len(out)):
        if rng.random() < rate:
            out[i] = answer[rng.randrange(len(answer))]
    return out + [0]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    tok = CrudeTokenizer()
    n_hist, n_new = args.history_problems, args.requests
    examples = load_examples(args.data, n_hist + 4 * n_new)
    problems = [
        (f"p{i}", tok.encode("Question: " + q + "\nAnswer:"), tok.encode(" " + a))
        for i, (q, a) in enumerate(examples)
    ]

    suffix = SuffixTreeDrafter()
    ngram = NgramDrafter()
    drafters: dict[str, Drafter] = {"suffix": suffix, "ngram": ngram}

    # history: a few hundred finished responses
    t0 = time.perf_counter()
    n_resp = 0
    for pid, prompt, answer in problems[:n_hist]:
        for g in range(args.group):
            rid = f"h-{pid}-{g}"
            suffix.start_request(rid, pid, prompt)
            suffix.finish_request(rid, pid, sibling(answer, rng))
            n_resp += 1
    suffix.flush()  # finish_request only queues; index the history now (the worker does it after a rollout)
    history_s = time.perf_counter() - t0

    fresh = iter(problems[n_hist:])
    counter = [0]

    def new_request() -> dict:
        # 3/4 on problems with history (a sibling still running), 1/4 on unseen problems
        if rng.random() < 0.75:
            pid, prompt, answer = problems[rng.randrange(n_hist)]
        else:
            pid, prompt, answer = next(fresh, problems[rng.randrange(n_hist)])
        resp = sibling(answer, rng)
        counter[0] += 1
        rid = f"r{counter[0]}"
        # start part-way so that contexts are ~300 tokens (prompt + generated so far)
        done = rng.randrange(max(1, min(len(resp) - 1, max(0, args.context - len(prompt)) + 1)))
        for d in drafters.values():
            d.start_request(rid, pid, prompt)
            d.observe(rid, resp[:done])
        return {"rid": rid, "pid": pid, "ids": prompt + resp[:done], "np": len(prompt), "rest": resp[done:]}

    running = [new_request() for _ in range(n_new)]
    times: dict[str, list[float]] = {k: [] for k in drafters}
    cpu_times: dict[str, list[float]] = {k: [] for k in drafters}
    drafted: dict[str, list[int]] = {k: [] for k in drafters}
    accepted: dict[str, list[int]] = {k: [] for k in drafters}
    ctx_lens: list[int] = []
    observe_s: list[float] = []
    finish_s: list[float] = []
    for _step in range(args.steps):
        reqs = [DraftRequest(r["rid"], r["pid"], r["ids"], r["np"]) for r in running]
        budgets = [args.budget] * len(reqs)
        ctx_lens.extend(len(r["ids"]) for r in running)
        drafts = {}
        for name, d in drafters.items():
            t, c = time.perf_counter(), time.process_time()
            out = d.propose(reqs, budgets, args.width, 0)
            times[name].append(time.perf_counter() - t)
            cpu_times[name].append(time.process_time() - c)
            drafts[name] = out
            for r, tree in zip(running, out):
                acc = 0
                for x, y in zip(tree.tokens, r["rest"]):  # chain: greedy acceptance vs the true text
                    if x != y:
                        break
                    acc += 1
                drafted[name].append(len(tree))
                accepted[name].append(acc)
        # commit along the suffix drafter's accepted prefix (+1 bonus), as the engine would
        t_obs = 0.0
        for i, r in enumerate(running):
            tree = drafts["suffix"][i]
            acc = 0
            for x, y in zip(tree.tokens, r["rest"]):
                if x != y:
                    break
                acc += 1
            c = r["rest"][: acc + 1]
            r["ids"] = r["ids"] + c
            r["rest"] = r["rest"][acc + 1 :]
            t = time.perf_counter()
            for d in drafters.values():
                d.observe(r["rid"], c)
            t_obs += time.perf_counter() - t
            if not r["rest"]:
                t = time.perf_counter()
                for d in drafters.values():
                    d.finish_request(r["rid"], r["pid"], r["ids"][r["np"] :])
                    d.flush()  # the queued indexing too: finish_request_ms = the full cost per response
                finish_s.append(time.perf_counter() - t)
                running[i] = new_request()
        observe_s.append(t_obs)

    res: dict = {}
    for name in drafters:
        ts = times[name]
        med = statistics.median(ts)
        res[name] = {
            "propose_ms_median": med * 1e3,
            "propose_ms_p90": pct(ts, 0.9) * 1e3,
            "propose_us_per_request": med * 1e6 / n_new,
            "propose_cpu_ms_median": statistics.median(cpu_times[name]) * 1e3,
            "propose_cpu_ms_p90": pct(cpu_times[name], 0.9) * 1e3,
            "mean_draft_len": statistics.fmean(drafted[name]),
            "mean_accepted_per_step": statistics.fmean(accepted[name]),
        }
        if args.target_forward_ms:
            res[name]["propose_over_forward"] = med * 1e3 / args.target_forward_ms
    res["suffix"]["observe_ms_per_step_median"] = statistics.median(observe_s) * 1e3
    res["suffix"]["finish_request_ms_mean"] = statistics.fmean(finish_s) * 1e3 if finish_s else None
    res["suffix"]["history_build_s"] = history_s
    res["suffix"]["history_responses"] = n_resp
    res["suffix"]["tries"] = suffix.stats()
    return {
        "benchmark": "drafter_propose_cost",
        "command": "python -m benchmarks.drafter_propose_cost " + " ".join(sys.argv[1:]),
        "machine": {
            "processor": platform.processor(),
            "cpu_model": cpu_model(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(),
        },
        "params": {
            "requests": n_new,
            "steps": args.steps,
            "budget": args.budget,
            "width": args.width,
            "group": args.group,
            "history_problems": n_hist,
            "target_context_tokens": args.context,
            "mean_context_tokens": statistics.fmean(ctx_lens),
            "vocab_size": len(tok.vocab),
            "target_forward_ms": args.target_forward_ms,
            "suffix_config": suffix.state_dict()["config"],
            "ngram_config": {"max_ngram": ngram.max_ngram, "min_ngram": ngram.min_ngram},
        },
        "results": res,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--width", type=int, default=1)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--history-problems", type=int, default=100)
    ap.add_argument("--context", type=int, default=300, help="target context length (tokens)")
    ap.add_argument("--target-forward-ms", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(result["results"], indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
