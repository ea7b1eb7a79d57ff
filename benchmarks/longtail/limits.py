"""What bounds the measurement: the decode step at batch 1 against the time to read the weights once at the
measured memory bandwidth (``benchmarks/machine.py``), and the acceptance ceiling of the policy at these
sampling settings (the tau an oracle deterministic drafter would reach, teacher-forced on plain responses).
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.longtail.runners import RunResult
from benchmarks.longtail.workload import PLAIN
from services.rollout_actor.model import Transformer


@torch.inference_mode()
def measure_forward_ms(model: Transformer, batch: int, context: int = 256, repeats: int = 30) -> float:
    """Median wall time (ms) of one decode forward (1 new token per row) at ``batch`` rows with ``context``
    cached tokens each: the target forward a speculative step amortizes."""
    v = model.config.vocab_size
    dev = next(model.parameters()).device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    cache = model.new_cache(batch, context + 8)
    slots = torch.arange(batch, device=dev)
    ids = torch.randint(0, v, (batch, context), generator=g).to(dev)
    model(ids, cache=cache, slots=slots, last_only=True)
    cache.commit(slots, torch.full((batch,), context, device=dev))
    one = torch.randint(0, v, (batch, 1), generator=g).to(dev)
    times = []
    for i in range(repeats + 3):
        sync()
        t = time.perf_counter()
        model(one, cache=cache, slots=slots)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


@torch.inference_mode()
def acceptance_ceiling(
    model: Transformer, seqs: list[tuple[list[int], list[int]]], sampling: dict, ks=(1, 2, 4, 8, 12, 16)
) -> dict:
    """What any deterministic drafter can at best get from this policy at these sampling settings.

    A point-mass draft token x is accepted with probability p(x) (p = the processed target distribution), so
    the best possible draft is the argmax, accepted with p_max. Over plain-decoded responses (teacher-forced,
    one forward each), the oracle chain of k argmax drafts from position t accepts
    ``sum_j prod_{i<=j} p_max(t+i)`` tokens in expectation; ``oracle_tau[k]`` = that + 1 (tokens per verify
    step), averaged over t. Returns the mean p_max, the mean probability of the token sampled, and oracle_tau."""
    from services.rollout_actor.sampling import processed_probs

    dev = next(model.parameters()).device
    pmax_all, psamp_all, acc = [], [], {k: [] for k in ks}
    for prompt, out in seqs:
        if not out:
            continue
        ids = torch.tensor([prompt + out], device=dev)
        logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) + len(out) - 1].cpu()
        probs = processed_probs(logits, sampling["temperature"], sampling["top_k"], sampling["top_p"])
        pmax = probs.max(-1).values
        pmax_all.append(pmax)
        psamp_all.append(probs.gather(-1, torch.tensor(out).unsqueeze(-1)).squeeze(-1))
        pl = pmax.tolist()
        for k in ks:
            for t in range(len(out)):
                run, tot = 1.0, 0.0
                for j in range(t, min(len(out), t + k)):
                    run *= pl[j]
                    tot += run
                acc[k].append(tot)
    if not pmax_all:
        return {}
    pm, ps = torch.cat(pmax_all), torch.cat(psamp_all)
    return {
        "responses": len(pmax_all),
        "positions": int(pm.numel()),
        "mean_p_max": float(pm.mean()),
        "median_p_max": float(pm.median()),
        "mean_p_sampled": float(ps.mean()),
        "oracle_tau": {str(k): 1 + statistics.fmean(v) for k, v in acc.items()},
    }


def limits(model: Transformer, read_gbps: float, runs: list[RunResult]) -> dict:
    """The batch-1 limit: the engine's decode step (plain makespan / steps at batch 1) and a bare forward
    against the weight-read bound; the forward at batch 64."""
    wb = sum(p.numel() * p.element_size() for p in model.parameters())  # shared (tied) tensors once
    bound_ms = wb / (read_gbps * 1e9) * 1e3
    fwd1 = measure_forward_ms(model, 1)
    plain1 = [r for r in runs if r.config == PLAIN and r.batch_size == 1 and r.timeline]
    eng1 = statistics.median([r.makespan_s / len(r.timeline) for r in plain1]) * 1e3 if plain1 else None
    return {
        "weight_bytes": wb,
        "read_gbps": read_gbps,
        "weight_read_bound_ms": bound_ms,
        "forward_ms_batch1": fwd1,
        "forward_ms_batch64": measure_forward_ms(model, 64, repeats=10),
        "forward_context_tokens": 256,
        "forward_over_bound": fwd1 / bound_ms,
        "engine_step_ms_batch1": eng1,
        "engine_step_over_bound": eng1 / bound_ms if eng1 else None,
    }
