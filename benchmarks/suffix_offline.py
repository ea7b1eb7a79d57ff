"""Offline acceptance length (tau) of the suffix drafter on real rollouts, SuffixDecoding's simulation protocol.

Run from the repository root::

    python -m benchmarks.suffix_offline [--tokenizer PATH --tokenizer-label NAME] [--ks 8,16,32]
        [--settings siblings,cold] [--limit-problems N] [--drafter-args '{"alpha": 1.0}'] [--prefix-chains 4,8]

Protocol (SuffixDecoding, Oliaro et al. 2024, arXiv 2411.04975; ArcticInference's offline simulation): the
rollouts in ``data/traces/qwen25-math-math-cot/math_cot_50.jsonl`` (50 MATH problems x G = 8 sampled responses
of Qwen2.5-Math) stand in for the target model's output. Each response is replayed token by token: at position
t the drafter gets the request's context (prompt + response[:t]) and proposes a chain of at most K tokens; the
accepted length is the longest prefix of the draft equal to response[t:t+K]; the request then advances by
accepted + 1 tokens (the verify step's accepted tokens plus the target's own token), which the drafter observes.
tau = response tokens / verify steps, pooled over all responses (also given: the mean of per-response tau, the
mean draft length, accepted / drafted tokens, the share of steps with a draft, and the process CPU time per
``propose`` call, the request's first call, which builds its trie over the prompt, included). No model runs: greedy exact-match acceptance is what a
lossless verifier accepts when the target's sampled continuation is the recorded one.

History, leave-one-problem-out (the global cache is FIFO, sized in responses: (P - 1) x G):

* **siblings** (ArcticInference's cache with the other responses of the same prompt): for response j of
  problem i the problem source holds the other G - 1 = 7 responses of problem i as finished siblings (a FIFO
  of G - 1 responses: after a response is replayed it is added and evicts the next one to replay), and the
  global source holds all G responses of every other problem. The request source holds the request's own
  prompt and output so far.
* **cold** (a problem seen for the first time): no response of problem i anywhere; the global source holds
  every other problem's responses, the request source the request's own prompt and output.

Siblings' indexing is completed (``flush``) before each replay, so drafts see every sibling whole.

Prompt: ``system + "\\n\\n" + question + "\\n\\n"``, tokenized with ``--tokenizer`` (default: the embedded
policy's BPE, label ``tiny``). Writes ``benchmarks/results/suffix_offline.{json,md}`` (``--out`` stem); with
``--before`` an earlier run's JSON, the markdown adds a before/after table. ``suffix_offline_before.json`` is
the drafter before the changes of issue #28 item 5 (commit 9880790: longest match only, ``min_match_len = 2``,
chain match capped by the room below it, global capacity 65,536 tokens), run with this protocol through a
thin adapter (its global cache capped at the same number of responses).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.machine import describe_machine
from services.rollout_actor.speculative.base import DraftRequest
from services.rollout_actor.speculative.suffix_tree import SuffixTreeDrafter

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "traces" / "qwen25-math-math-cot" / "math_cot_50.jsonl"
TOKENIZER = REPO / "services" / "pipeline" / "assets" / "base_policy" / "tokenizer.json"
OUT = REPO / "benchmarks" / "results" / "suffix_offline"


def load_problems(
    path: Path, tokenizer_path: Path, limit: int
) -> list[tuple[str, list[int], list[list[int]]]]:
    """``[(problem_id, prompt_ids, [response_ids, ...])]`` of the first ``limit`` problems (0: all)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    out = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            prompt = tok.encode(f"{row.get('system', '')}\n\n{row['question']}\n\n").ids
            resps = [tok.encode(r).ids for r in row["responses"]]
            out.append((f"p{row.get('idx', len(out))}", prompt, resps))
            if limit and len(out) >= limit:
                break
    return out


def _accepted(draft, resp: list[int], pos: int) -> int:
    """The longest prefix of ``draft`` equal to ``resp[pos:]``."""
    acc = 0
    for x in draft:
        if pos + acc >= len(resp) or resp[pos + acc] != x:
            break
        acc += 1
    return acc


def replay(
    d: SuffixTreeDrafter, rid: str, pid: str, prompt: list[int], resp: list[int], k: int, shadow=()
) -> dict:
    """Replay one response against the drafter (chain drafts of <= k tokens); verify-step statistics. For each
    budget j in ``shadow`` (< k), also the chain of budget j proposed on the same context (not played):
    ``shadow[j]`` = [its accepted tokens, ``min(accepted, j)`` of the played draft (the selector's
    counterfactual record), steps where its draft is a prefix of the played one], summed over the steps."""
    d.start_request(rid, pid, prompt)
    ctx = list(prompt)
    pos = steps = drafted = with_draft = 0
    t_prop = 0.0
    n = len(resp)
    sums = {j: [0, 0, 0] for j in shadow}
    while pos < n:
        req = [DraftRequest(rid, pid, ctx, len(prompt))]
        t = time.process_time()  # CPU time: the machine may be shared
        (tree,) = d.propose(req, [k])
        t_prop += time.process_time() - t
        draft = tree.tokens
        acc = _accepted(draft, resp, pos)
        for j, row in sums.items():
            (other,) = d.propose(req, [j])
            row[0] += _accepted(other.tokens, resp, pos)
            row[1] += min(acc, j)
            row[2] += list(other.tokens) == list(draft[: len(other.tokens)])
        commit = resp[pos : pos + acc + 1]
        ctx += commit
        d.observe(rid, commit)
        pos += len(commit)
        steps += 1
        drafted += len(draft)
        with_draft += bool(draft)
    d.finish_request(rid, pid, [])  # drop the request; the protocol adds responses itself
    out = {"tokens": n, "steps": steps, "drafted": drafted, "with_draft": with_draft, "propose_s": t_prop}
    return out | {"shadow": sums}


def run_setting(problems, setting: str, k: int, drafter_args: dict, shadow=()) -> dict:
    """Replay every response of every problem in one setting with budget ``k``; pooled statistics, and per
    budget j in ``shadow`` below ``k`` (``prefix_chains``): the accepted tokens per step of its own drafts and
    of the counterfactual ``min(accepted, j)``, their ratio, and the share of steps where its draft is a
    prefix of the played one."""
    groups = [len(r) for _, _, r in problems]
    g = groups[0]
    if any(x != g for x in groups):
        raise ValueError("every problem needs the same number of responses")
    siblings = setting == "siblings"
    d = SuffixTreeDrafter(
        **{
            **drafter_args,
            "problem_capacity": g - 1 if siblings else 0,
            "global_capacity": (len(problems) - 1) * g,
            "window_steps": 1 << 30,
        }
    )
    for pid, prompt, resps in problems[1:]:  # the global cache: every other problem (FIFO, see docstring)
        for r in resps:
            d.add_history(pid, prompt, r, to_problem=False)
    d.flush()
    rows = []
    t0 = time.perf_counter()
    for i, (pid, prompt, resps) in enumerate(problems):
        if siblings:
            for r in resps[1:]:
                d.add_history(pid, prompt, r, to_global=False)
        for j, r in enumerate(resps):
            d.flush()
            rows.append(replay(d, f"{pid}/{j}", pid, prompt, r, k, [x for x in shadow if x < k]))
            if siblings and j < g - 1:
                d.add_history(pid, prompt, r, to_global=False)  # evicts response j + 1, replayed next
        for r in resps:  # problem i joins the global cache, evicting problem i + 1 (replayed next)
            d.add_history(pid, prompt, r, to_problem=False)
        d.flush()
        if i == 0:
            stats = d.stats()
    tokens = sum(x["tokens"] for x in rows)
    steps = sum(x["steps"] for x in rows)
    chains = {}
    for j in rows[0]["shadow"]:
        own, cf, same = (sum(x["shadow"][j][c] for x in rows) for c in range(3))
        chains[j] = {"accepted_per_step": own / steps, "counterfactual_per_step": cf / steps}
        chains[j] |= {"counterfactual_over_own": cf / own if own else None, "prefix_share": same / steps}
    return {
        "setting": setting,
        "k": k,
        "tau": tokens / steps,
        "tau_mean_per_response": statistics.fmean(x["tokens"] / x["steps"] for x in rows),
        "mean_draft_len": sum(x["drafted"] for x in rows) / steps,
        "steps_with_draft": sum(x["with_draft"] for x in rows) / steps,
        "accepted_per_drafted": (tokens - steps) / max(1, sum(x["drafted"] for x in rows)),
        "responses": len(rows),
        "tokens": tokens,
        "verify_steps": steps,
        "propose_cpu_us_per_call": 1e6 * sum(x["propose_s"] for x in rows) / steps,
        "wall_s": time.perf_counter() - t0,
        "tries_after_first_problem": stats,
    } | ({"prefix_chains": chains} if chains else {})


def to_markdown(result: dict, before: dict | None = None) -> str:
    p = result["params"]
    lines = [
        "## Suffix drafter, offline tau (`python -m benchmarks.suffix_offline`)",
        "",
        f"SuffixDecoding's offline protocol on {p['problems']} MATH problems x {p['group']} Qwen2.5-Math "
        f"responses ({p['tokens']} response tokens, tokenizer `{p['tokenizer_label']}`). Chain drafts of <= K "
        "tokens, accepted = longest prefix equal to the recorded continuation, tau = tokens / verify steps. "
        "siblings: the problem's other 7 responses + all other problems' responses in the cache; cold: only "
        "other problems' responses (leave-one-problem-out). Drafter config: "
        f"`{json.dumps(result['drafter_config'])}`.",
        "",
        "| setting | K | tau | tau (mean per response) | draft len / step | accepted / drafted | steps with a draft "
        "| propose CPU us / call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["results"]:
        lines.append(
            f"| {r['setting']} | {r['k']} | {r['tau']:.2f} | {r['tau_mean_per_response']:.2f} | "
            f"{r['mean_draft_len']:.2f} | {r['accepted_per_drafted']:.0%} | {r['steps_with_draft']:.0%} | "
            f"{r['propose_cpu_us_per_call']:.0f} |"
        )
    lines.append("")
    chains = [(r, j, c) for r in result["results"] for j, c in r.get("prefix_chains", {}).items()]
    if chains:
        lines += [
            "Prefix chains (`--prefix-chains`): at each step of the chain of K, the chain of j < K tokens proposed "
            "on the same context, against the tuner's counterfactual record of it, `min(accepted_K, j)`:",
            "",
            "| setting | K | j | accepted / step (own draft) | counterfactual / step | ratio | prefix of K's draft |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r, j, c in chains:
            lines.append(
                f"| {r['setting']} | {r['k']} | {j} | {c['accepted_per_step']:.3f} | "
                f"{c['counterfactual_per_step']:.3f} | {c['counterfactual_over_own']:.3f} | {c['prefix_share']:.1%} |"
            )
        lines.append("")
    if before is not None:
        old = {(r["setting"], r["k"]): r for r in before["results"]}
        lines += [
            f"Before vs after (before: {before.get('label', 'an earlier run')}; drafter config "
            f"`{json.dumps(before['drafter_config'])}`; same protocol and tokenizer "
            f"`{before['params']['tokenizer_label']}`):",
            "",
            "| setting | K | tau before | tau after | after / before | draft len / step before | after |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["results"]:
            b = old.get((r["setting"], r["k"]))
            if b is not None:
                lines.append(
                    f"| {r['setting']} | {r['k']} | {b['tau']:.2f} | {r['tau']:.2f} | {r['tau'] / b['tau']:.3f} | "
                    f"{b['mean_draft_len']:.2f} | {r['mean_draft_len']:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--tokenizer", type=Path, default=TOKENIZER, help="a tokenizers-library tokenizer.json")
    ap.add_argument("--tokenizer-label", default="tiny")
    ap.add_argument("--ks", default="8,16,32", help="draft budgets K (comma-separated)")
    ap.add_argument("--settings", default="siblings,cold")
    ap.add_argument("--limit-problems", type=int, default=0, help="first N problems only (0: all)")
    ap.add_argument("--drafter-args", default="{}", help="JSON kwargs for SuffixTreeDrafter (tuning)")
    ap.add_argument(
        "--prefix-chains",
        default="",
        help="budgets j (comma-separated): per step also propose a chain of j < K tokens, to check the "
        "tuner's counterfactual records (min(accepted, j) of the K-chain) against the j-chain's own drafts",
    )
    ap.add_argument("--out", type=Path, default=OUT, help="output stem (.json and .md are written)")
    ap.add_argument(
        "--before", type=Path, default=None, help="an earlier run's JSON: the markdown compares tau with it"
    )
    args = ap.parse_args(argv)
    problems = load_problems(args.data, args.tokenizer, args.limit_problems)
    drafter_args = json.loads(args.drafter_args)
    results = []
    shadow = [int(x) for x in args.prefix_chains.split(",") if x]
    for setting in args.settings.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            r = run_setting(problems, setting, k, drafter_args, shadow)
            print(
                f"{setting:9s} K={k:2d} tau={r['tau']:.3f} draft/step={r['mean_draft_len']:.2f} "
                f"propose={r['propose_cpu_us_per_call']:.0f}us wall={r['wall_s']:.1f}s",
                flush=True,
            )
            for j, c in r.get("prefix_chains", {}).items():
                print(
                    f"  chain of {j}: accepted/step {c['accepted_per_step']:.3f}, counterfactual "
                    f"{c['counterfactual_per_step']:.3f} (x{c['counterfactual_over_own']:.3f}), prefix of "
                    f"K's draft on {c['prefix_share']:.1%} of steps",
                    flush=True,
                )
            results.append(r)
    cfg = SuffixTreeDrafter(**drafter_args).state_dict()["config"]
    result = {
        "benchmark": "suffix_offline",
        "command": "python -m benchmarks.suffix_offline " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": describe_machine(),
        "params": {
            "data": str(args.data.relative_to(REPO) if args.data.is_relative_to(REPO) else args.data),
            "tokenizer_label": args.tokenizer_label,
            "problems": len(problems),
            "group": len(problems[0][2]),
            "tokens": sum(len(r) for _, _, rs in problems for r in rs),
            "prompt_tokens_mean": statistics.fmean(len(p) for _, p, _ in problems),
        },
        "drafter_config": {
            k: v for k, v in cfg.items() if k not in ("problem_capacity", "global_capacity", "window_steps")
        },
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    before = json.loads(args.before.read_text()) if args.before else None
    if before is not None:
        result["before"] = str(
            args.before.relative_to(REPO) if args.before.is_relative_to(REPO) else args.before
        )
    args.out.with_suffix(".md").write_text(to_markdown(result, before))
    print(f"wrote {args.out}.json/.md")


if __name__ == "__main__":
    main()
