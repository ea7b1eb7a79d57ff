"""One GRPO policy update, response tokens trained per second: the packed trainer vs the previous padded
implementation vs TRL's ``GRPOTrainer`` loss path, and the FLOP bound of this CPU.

Run from the repository root::

    python -m benchmarks.policy_update [--quick] [--reps 3] [--prompts 16] [--group 8] [--peer auto]
        [--out-dir benchmarks/results]

Samples: the embedded policy (``services/pipeline/assets/base_policy``) samples ``--group`` responses to each
of ``--prompts`` GSM8K train questions (``data/gsm8k``) with the rollout engine, as ``make run`` does
(temperature 0.9, ``max_new_tokens`` 320, fixed seeds): real prompt and response lengths, long tail
included. Rewards are seeded Bernoulli(0.3) draws turned into group-normalized advantages (the update's cost
does not depend on them). Every method trains the same samples with the same micro-batch (32 sequences,
``configs/gsm8k_tiny.yaml``), one optimizer step (AdamW, gradient clipping at 1.0), its own copy of the
policy, with ``update_threads(0)`` torch threads (``trainer.threads`` default):

* ``previous``: the padded implementation this benchmark replaced, kept here (``legacy_padded_update``) and
  nowhere else: right-padded ``prompt + response`` rows, a separate ``no_grad`` forward for pi_old, the LM
  head at every position.
* ``packed``: ``PolicyTrainer.train_step`` (``services/policy_trainer/packing.py``).
* ``trl``: TRL's ``GRPOTrainer.compute_loss`` (``loss_type="dapo"``: the same token-mean clipped loss; pi_old =
  its own detached log-probs, no extra forward) on the Hugging Face ``Qwen2ForCausalLM`` loaded from the same
  folder, left-padded prompts and right-padded completions per micro-batch, then ``backward`` and the same
  AdamW step. When TRL cannot be imported, ``transformers`` instead: a plain HF forward + backward of the
  same loss over the same right-padded micro-batches (``--peer`` picks; the JSON says which ran and why).

The methods run interleaved (a rotating order in each of ``--reps`` rounds, after one untimed warm-up each),
so a change in the machine's load hits all of them. Reported per method: seconds per update (median, all
repetitions), response tokens / s, the ratio to ``previous`` per round and its median. The FLOP bound: a
large fp32 matmul measured in the same process and each round gives the achievable GFLOP/s; the update's
useful work is counted on the packed layout (the least any method must compute): training FLOPs = 3 x
forward FLOPs (forward + backward), forward = 2 x (decoder matmul weights x packed tokens + LM-head weights x
response tokens) + 4 x heads x head_dim x (causal query-key pairs) per layer. ``fraction_of_flop_bound`` =
that work / seconds / matmul FLOP/s; ``6 N D`` (6 x parameters x response tokens) is given too.

Writes ``<name>.{json,md,png}`` under ``--out-dir`` (``--name``, default ``policy_update``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import describe_machine
from services.common.config import TrainerConfig
from services.pipeline.datasets import default_dataset_dir, format_prompt, load_gsm8k
from services.policy_trainer.actor import update_threads
from services.policy_trainer.grpo import group_advantages, grpo_loss, token_logprobs
from services.policy_trainer.packing import pack_samples
from services.policy_trainer.trainer import PolicyTrainer, RolloutSample
from services.rollout_actor.model import Transformer

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "services" / "pipeline" / "assets" / "base_policy"
RESULTS = REPO / "benchmarks" / "results"
METHODS = ("previous", "packed", "peer")


# ------------------------------------------------------------------------------------------- samples
def make_samples(prompts: int, group: int, max_new_tokens: int, seed: int = 0) -> list[RolloutSample]:
    """``prompts * group`` rollouts of the embedded policy on GSM8K train questions (see the module doc)."""
    from tokenizers import Tokenizer

    from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    examples = load_gsm8k(default_dataset_dir() / "train.jsonl")[:prompts]
    engine = Engine(Transformer.from_pretrained(MODEL), max_batch_size=64, max_seq_len=1024, seed=seed)
    reqs = []
    for i, ex in enumerate(examples):
        ids = tok.encode(format_prompt(ex.question)).ids
        for j in range(group):
            params = SamplingParams(0.9, max_new_tokens=max_new_tokens, seed=seed * 100_003 + i * group + j)
            reqs.append(GenerationRequest(f"{i}-{j}", ids, params, problem_id=str(i)))
    outs = engine.generate(reqs)
    g = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(prompts, group, generator=g) < 0.3).float()
    adv = group_advantages(rewards).flatten().tolist()
    return [RolloutSample(list(o.prompt_ids), list(o.token_ids), a) for o, a in zip(outs, adv)]


# ------------------------------------------------------------------- the previous (padded) update
def legacy_padded_update(trainer: PolicyTrainer, samples: list[RolloutSample], gen: torch.Generator) -> dict:
    """The GRPO update as ``PolicyTrainer.train_step`` computed it before packing (torch backend only):
    right-padded rows, a ``no_grad`` pi_old forward in the first pass's shuffled micro-batch layout, the
    LM head at every position. Same loss and optimizer step; returns ``loss``, ``tokens`` and
    ``padded_positions`` (rows x longest row, summed over the micro-batches of one pass)."""
    model, cfg = trainer.model, trainer.cfg
    pad = model.config.pad_token_id
    pad = pad if isinstance(pad, int) and 0 <= pad < model.config.vocab_size else 0
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    n, t = len(seqs), max(len(s) for s in seqs) - 1
    inputs = torch.full((n, t), pad, dtype=torch.long)
    targets = torch.full((n, t), pad, dtype=torch.long)
    mask = torch.zeros(n, t)
    lengths = torch.zeros(n, dtype=torch.long)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        length = len(seq) - 1
        if length <= 0:
            continue
        row = torch.as_tensor(seq, dtype=torch.long)
        inputs[i, :length], targets[i, :length] = row[:-1], row[1:]
        mask[i, max(len(s.prompt_ids) - 1, 0) : length] = 1.0
        lengths[i] = length
    adv = torch.tensor([float(s.advantage) for s in samples])
    total = float(mask.sum())
    mb = max(1, int(cfg.micro_batch_size))
    order = torch.randperm(n, generator=gen)
    batches = [order[i : i + mb] for i in range(0, n, mb)]
    model.eval()
    old = torch.zeros(n, t)
    with torch.no_grad():
        for rows in batches:
            tm = int(lengths[rows].max())
            old[rows, :tm] = token_logprobs(model(inputs[rows, :tm]).logits, targets[rows, :tm])
    model.train()
    trainer._backend.zero_grad()
    loss_sum, positions = 0.0, 0
    for rows in batches:
        tm = int(lengths[rows].max())
        positions += len(rows) * tm
        lp = token_logprobs(model(inputs[rows, :tm]).logits, targets[rows, :tm])
        loss, st = grpo_loss(lp, old[rows, :tm], adv[rows], mask[rows, :tm], cfg.clip_eps, num_tokens=total)
        loss.backward()
        loss_sum += st["loss"]
    trainer._backend.step()
    trainer._backend.zero_grad()
    return {"loss": loss_sum, "tokens": total, "padded_positions": positions}


# ------------------------------------------------------------------------------------------ peers
def _padded_micro_batches(samples, mb: int, pad: int, left_pad_prompt: bool):
    """Per micro-batch (sample order): prompt ``[B, P]`` + mask, completion ``[B, C]`` + mask, advantages."""
    for s in range(0, len(samples), mb):
        chunk = samples[s : s + mb]
        p_len = max(len(x.prompt_ids) for x in chunk)
        c_len = max(len(x.response_ids) for x in chunk)
        b = len(chunk)
        pid, pm = torch.full((b, p_len), pad, dtype=torch.long), torch.zeros(b, p_len, dtype=torch.long)
        cid, cm = torch.full((b, c_len), pad, dtype=torch.long), torch.zeros(b, c_len, dtype=torch.long)
        for i, x in enumerate(chunk):
            p, c = len(x.prompt_ids), len(x.response_ids)
            sl = slice(p_len - p, p_len) if left_pad_prompt else slice(0, p)
            pid[i, sl], pm[i, sl] = torch.tensor(x.prompt_ids, dtype=torch.long), 1
            cid[i, :c], cm[i, :c] = torch.tensor(x.response_ids, dtype=torch.long), 1
        yield pid, pm, cid, cm, torch.tensor([x.advantage for x in chunk])


class PeerUpdate:
    """TRL's ``GRPOTrainer`` loss path, or a plain transformers forward + backward (see the module doc)."""

    def __init__(self, kind: str, cfg: TrainerConfig):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.model = AutoModelForCausalLM.from_pretrained(
            MODEL, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.pad = int(self.model.config.pad_token_id or 0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas))
        self.kind = kind
        self.version = None
        if kind == "trl":
            import trl
            from datasets import Dataset
            from transformers import PreTrainedTokenizerFast
            from trl import GRPOConfig, GRPOTrainer

            self.version = trl.__version__
            args = GRPOConfig(
                output_dir=tempfile.mkdtemp(prefix="policy_update_trl_"),
                use_cpu=True,
                per_device_train_batch_size=cfg.micro_batch_size,
                num_generations=8,
                gradient_accumulation_steps=1,
                steps_per_generation=1,
                loss_type="dapo",
                beta=0.0,
                epsilon=cfg.clip_eps,
                learning_rate=cfg.lr,
                max_grad_norm=cfg.max_grad_norm,
                report_to=[],
                bf16=False,
                fp16=False,
            )
            self.trl = GRPOTrainer(
                model=self.model,
                reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                args=args,
                train_dataset=Dataset.from_dict({"prompt": ["-"] * 8}),
                processing_class=PreTrainedTokenizerFast.from_pretrained(MODEL),
            )
            self.trl.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which is not run here
        else:
            import transformers

            self.version = transformers.__version__

    def update(self, samples: list[RolloutSample]) -> dict:
        total = float(sum(len(s.response_ids) for s in samples))
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        left = self.kind == "trl"
        for pid, pm, cid, cm, adv in _padded_micro_batches(
            samples, self.cfg.micro_batch_size, self.pad, left
        ):
            if self.kind == "trl":
                inputs = {
                    "prompt_ids": pid,
                    "prompt_mask": pm,
                    "completion_ids": cid,
                    "completion_mask": cm,
                    "advantages": adv,
                    "num_items_in_batch": torch.tensor(total),
                }
                loss = self.trl.compute_loss(self.model, inputs)
            else:
                ids, attn = torch.cat([pid, cid], 1), torch.cat([pm, cm], 1)
                logits = self.model(input_ids=ids, attention_mask=attn).logits[:, pid.shape[1] - 1 : -1]
                lp = token_logprobs(logits, cid)
                loss, _ = grpo_loss(lp, lp.detach(), adv, cm, self.cfg.clip_eps, num_tokens=total)
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return {"loss": loss_sum, "tokens": total}


def choose_peer(requested: str) -> tuple[str, str | None]:
    """``(kind, reason)``: ``trl`` when requested (or ``auto``) and importable, else ``transformers``."""
    if requested == "transformers":
        return "transformers", "requested with --peer transformers"
    try:
        from trl import GRPOTrainer  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means TRL cannot run here
        if requested == "trl":
            raise
        return "transformers", f"TRL could not be imported: {e!r}"
    return "trl", None


# ------------------------------------------------------------------------------------------ FLOPs
def matmul_gflops(n: int, repeats: int = 3) -> float:
    """Best achieved GFLOP/s of an fp32 ``[n, n] @ [n, n]`` (``2 n^3`` FLOPs) over ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def update_flops(model: Transformer, samples: list[RolloutSample], micro_batch_size: int) -> dict:
    """Training FLOPs (3 x forward) of the packed layout's work, and the ``6 N D`` count (module doc)."""
    c = model.config
    d_attn = c.num_attention_heads * c.head_dim
    d_kv = c.num_key_value_heads * c.head_dim
    layer = c.hidden_size * (2 * d_attn + 2 * d_kv) + 3 * c.hidden_size * c.intermediate_size
    head = c.hidden_size * c.vocab_size
    tokens = targets = pairs = 0
    for b in pack_samples(samples, micro_batch_size):
        tokens += b.input_ids.numel()
        targets += b.num_tokens
        for _, p, blocks in b.segments:
            pairs += p * (p + 1) // 2 + sum(n * p + n * (n + 1) // 2 for _, n in blocks)
    forward = 2 * (layer * c.num_hidden_layers * tokens + head * targets)
    forward += 4 * d_attn * pairs * c.num_hidden_layers
    return {
        "train_flops": 3 * forward,
        "six_n_d_flops": 6 * model.num_parameters() * targets,
        "packed_tokens": tokens,
        "response_tokens": targets,
        "attention_pairs_per_layer": pairs,
    }


# ------------------------------------------------------------------------------------------ run
def run(args) -> dict:
    threads = update_threads(args.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    samples = make_samples(args.prompts, args.group, args.max_new_tokens)
    gen_s = time.perf_counter() - t0
    cfg = TrainerConfig(
        lr=5e-5, clip_eps=0.2, kl_coef=0.0, micro_batch_size=args.micro_batch, max_grad_norm=1.0
    )
    base = Transformer.from_pretrained(MODEL)
    prev_tr = PolicyTrainer(copy.deepcopy(base), cfg)
    new_tr = PolicyTrainer(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(0)
    peer_kind, peer_reason = (
        (None, "not run (--peer none)") if args.peer == "none" else choose_peer(args.peer)
    )
    peer = PeerUpdate(peer_kind, cfg) if peer_kind else None
    fns = {
        "previous": lambda: legacy_padded_update(prev_tr, samples, gen),
        "packed": lambda: new_tr.train_step(samples),
    }
    if peer is not None:
        fns["peer"] = lambda: peer.update(samples)
    names = list(fns)
    first = {name: fns[name]() for name in names}  # warm-up (untimed); its first-pass loss is reported
    seconds: dict[str, list[float]] = {name: [] for name in names}
    gflops: list[float] = []
    for r in range(args.reps):
        gflops.append(matmul_gflops(args.matmul_n))
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t = time.perf_counter()
            fns[name]()
            seconds[name].append(time.perf_counter() - t)
            print(f"[policy_update] round {r + 1}/{args.reps} {name}: {seconds[name][-1]:.2f} s", flush=True)
    flops = update_flops(base, samples, cfg.micro_batch_size)
    tokens = flops["response_tokens"]
    peak = statistics.median(gflops) * 1e9
    res = {}
    for name in names:
        med = statistics.median(seconds[name])
        res[name] = {
            "seconds": seconds[name],
            "seconds_median": med,
            "tokens_per_s": tokens / med,
            "first_pass_loss": first[name]["loss"],
            "fraction_of_flop_bound": flops["train_flops"] / med / peak,
        }
    for name in names:
        per_round = [p / s for p, s in zip(seconds["previous"], seconds[name])]
        res[name]["speedup_vs_previous_per_round"] = per_round
        res[name]["speedup_vs_previous"] = statistics.median(per_round)
        if "peer" in seconds:
            res[name]["speedup_vs_peer"] = statistics.median(
                [p / s for p, s in zip(seconds["peer"], seconds[name])]
            )
    lengths = sorted(len(s.response_ids) for s in samples)
    prompts = sorted(len(s.prompt_ids) for s in samples)
    return {
        "benchmark": "policy_update",
        "quick": args.quick,
        "machine": describe_machine(),
        "threads": threads,
        "params": {
            "prompts": args.prompts,
            "group": args.group,
            "samples": len(samples),
            "max_new_tokens": args.max_new_tokens,
            "micro_batch_size": cfg.micro_batch_size,
            "reps": args.reps,
            "matmul_n": args.matmul_n,
            "generation_seconds": gen_s,
        },
        "samples": {
            "response_tokens": tokens,
            "response_len_p50": lengths[len(lengths) // 2],
            "response_len_max": lengths[-1],
            "prompt_len_p50": prompts[len(prompts) // 2],
            "prompt_len_max": prompts[-1],
            "previous_padded_positions": first["previous"]["padded_positions"],
        },
        "peer": {"kind": peer_kind, "version": peer.version if peer else None, "reason": peer_reason},
        "flops": {**flops, "matmul_gflops_per_round": gflops, "matmul_gflops": peak / 1e9},
        "flop_bound_tokens_per_s": tokens * peak / flops["train_flops"],
        "methods": res,
        "bar_new_over_previous": res["packed"]["speedup_vs_previous"],
    }


LABELS = {"previous": "previous (padded)", "packed": "packed (new)"}


def label(name: str, d: dict) -> str:
    if name == "peer":
        return f"{d['peer']['kind']} {d['peer']['version']} (padded)"
    return LABELS[name]


def markdown(d: dict) -> str:
    m, p, s = d["machine"], d["params"], d["samples"]
    lines = [
        "## GRPO policy update (`python -m benchmarks.policy_update`)",
        "",
        f"One update (one optimizer step) on {p['samples']} rollouts of the embedded policy ({p['prompts']} GSM8K "
        f"prompts x {p['group']}; prompt p50 {s['prompt_len_p50']} / max {s['prompt_len_max']} tokens, response "
        f"p50 {s['response_len_p50']} / max {s['response_len_max']}; {s['response_tokens']} response tokens), "
        f"micro-batch {p['micro_batch_size']}, {d['threads']} threads, {p['reps']} interleaved rounds; "
        f"{m['cpu_model']}, load {m['load_average_1_5_15']}. FLOP bound: fp32 matmul {p['matmul_n']}^3 at "
        f"{d['flops']['matmul_gflops']:.1f} GFLOP/s; the update's useful work {d['flops']['train_flops'] / 1e9:.1f} "
        f"GFLOP (packed layout, 3 x forward) -> at most {d['flop_bound_tokens_per_s']:.0f} response tokens/s.",
        "",
        "| method | s / update (median) | response tokens / s | vs previous (median of rounds) "
        "| vs peer | fraction of FLOP bound | first-pass loss |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in d["methods"].items():
        lines.append(
            f"| {label(name, d)} | {r['seconds_median']:.2f} | {r['tokens_per_s']:.0f} "
            f"| {r['speedup_vs_previous']:.2f}x | {r.get('speedup_vs_peer', float('nan')):.2f}x "
            f"| {r['fraction_of_flop_bound']:.3f} | {r['first_pass_loss']:.5f} |"
        )
    if d["peer"]["reason"]:
        lines.append(f"\nPeer: {d['peer']['reason']}.")
    lines.append(
        f"\nThe previous implementation computed {s['previous_padded_positions']} padded positions per pass "
        f"(plus a separate pi_old forward) for {d['flops']['packed_tokens']} packed positions now."
    )
    return "\n".join(lines) + "\n"


def plot(d: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(d["methods"])
    vals = [d["methods"][n]["tokens_per_s"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([label(n, d) for n in names], vals, color=["#999999", "#1f77b4", "#ff7f0e"][: len(names)])
    ax.axhline(d["flop_bound_tokens_per_s"], color="k", ls="--", label="FLOP bound (fp32 matmul peak)")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.0f}", ha="center", va="bottom")
    ax.set_yscale("log")
    ax.set_ylabel("response tokens trained / s")
    ax.set_title(f"One GRPO update, {d['params']['samples']} samples, {d['threads']} threads")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 prompts x 4, 48 new tokens, 1 round")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--matmul-n", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = every usable core")
    ap.add_argument("--peer", choices=("auto", "trl", "transformers", "none"), default="auto")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--name", default="policy_update", help="file stem of the outputs")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.prompts, args.group, args.max_new_tokens, args.matmul_n = 1, 2, 4, 48, 512
    d = run(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(d, indent=2))
    md = markdown(d)
    (args.out_dir / f"{args.name}.md").write_text(md)
    plot(d, args.out_dir / f"{args.name}.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
