"""Decode-step time with and without CUDA graphs (``services/rollout_actor/cuda_graphs.py``), side by side.

Run from the repository root (needs a CUDA GPU; without one it prints ``skipped: no CUDA`` and exits 0)::

    python -m benchmarks.cuda_graphs [--models base_policy,qwen2-0.5b] [--batches 1,4,16,64]

For each model and batch size B, two measurements, eager and graphed interleaved round by round:

* **forward**: one plain-decode forward (B requests x 1 token) against a slot KV cache holding ``--context``
  tokens per request, the lengths left unchanged so that every step does the same work: the eager
  ``Transformer.forward`` (what the engine runs without graphs) vs ``GraphedForward`` (copy inputs, replay;
  the graph attends over the key-length bucket above the need). Milliseconds per step: the median over
  ``--rounds`` rounds of ``--steps`` steps, each round timed between two device synchronizations.
* **engine step**: ``Engine`` decode steps (forward, greedy sampling, bookkeeping) with ``cuda_graphs`` off
  and on, B requests prefilled with ``--context`` tokens, the two engines stepped alternately; the median
  of ``StepRecord.seconds`` after the first three steps (the graph captures happen there).

* **kernels** (``profile_kernels``): one eager forward under ``torch.profiler``: kernels a decoder layer, and
  their device time split into matrix products and the rest (what fusing elementwise kernels could save). The
  model's projections are fused first, as the engine fuses them (``services/rollout_actor/fused.py``).
* **decode attention** (``time_decode_attention``): microseconds per attention call of one decode step, from
  a CUDA graph, for the model's kernel and two others (what a faster attention could save).
* **memory bound**: the least time a plain decode step can take on this card, ``decode_bytes`` (every weight
  the forward reads once, plus each request's cached keys and values) over the card's measured bandwidth
  (``benchmarks.machine.measure_memory_bandwidth``: the faster of a read and a copy); ``*_vs_bound`` is a
  step's time over it (1.0 = at the bound; serving engines such as vLLM and SGLang run within ~1.5x at small
  batch).

Models: ``base_policy`` (the committed policy, fp32, ~2 M parameters), ``qwen2-0.5b`` (Qwen2-0.5B's shapes
with random weights, bf16) and any real shape label of ``services/rollout_actor/shapes.py`` (``qwen2.5-7b``,
...: random weights, bf16). Writes ``benchmarks/results/cuda_graphs.json`` (ratios eager / graph > 1 mean
graphs are faster) and ``benchmarks/results/cuda_graphs.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.machine import describe_machine, measure_memory_bandwidth
from services.rollout_actor.attention import grouped_attention
from services.rollout_actor.cuda_graphs import (
    CudaGraphPool,
    GraphedForward,
    TorchCudaGraphBackend,
    kv_len_buckets,
)
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.fused import fuse_projections
from services.rollout_actor.model import ModelConfig, Transformer
from services.rollout_actor.shapes import REAL_SHAPES, build_model

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "cuda_graphs.json"
BASE_POLICY = REPO / "services" / "pipeline" / "assets" / "base_policy"

QWEN2_05B = ModelConfig(
    architecture="Qwen2ForCausalLM",
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    head_dim=64,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)


def load_model(name: str, device: torch.device) -> tuple[Transformer, str]:
    if name == "base_policy":
        return Transformer.from_pretrained(BASE_POLICY).to(device).eval(), "float32"
    if name == "qwen2-0.5b":
        with torch.device(device):
            model = Transformer(QWEN2_05B)  # random weights: step time does not depend on their values
        return model.to(torch.bfloat16).eval(), "bfloat16"
    if name in REAL_SHAPES:
        model = build_model(name, device)
        return model, str(next(model.parameters()).dtype).removeprefix("torch.")
    raise SystemExit(f"unknown model {name!r} (base_policy, qwen2-0.5b, {', '.join(REAL_SHAPES)})")


def decode_bytes(model: Transformer, batch: int, context: int) -> int:
    """Bytes one plain decode step of ``batch`` requests with ``context`` cached tokens each must read at least:
    every parameter once (the input embedding only when it is tied to the output layer; otherwise the step
    reads ``batch`` of its rows, left out) plus the cached keys and values, ``batch x context x layers x 2 x
    kv_heads x head_dim`` elements of the parameters' size."""
    cfg = model.config
    params = {id(p): p for p in model.parameters()}.values()
    nbytes = sum(p.numel() * p.element_size() for p in params)
    emb = model.model.embed_tokens.weight
    if not cfg.tie_word_embeddings:
        nbytes -= emb.numel() * emb.element_size()
    kv = batch * context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim
    return nbytes + kv * emb.element_size()


def _median_ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


@torch.inference_mode()
def time_forward(model: Transformer, batch: int, context: int, steps: int, rounds: int, seed: int) -> dict:
    dev = next(model.parameters()).device
    vocab = model.config.vocab_size
    max_len = context + 56
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (batch, context), generator=g).to(dev)
    slots = torch.arange(batch, device=dev)
    caches = []
    for _ in range(2):  # one for each path, prefilled alike; slot ``batch`` is the graphs' scratch slot
        cache = model.new_cache(batch + 1, max_len)
        model(prompt, cache=cache, slots=slots, last_only=True)
        cache.commit(slots, torch.full((batch,), context, device=dev))
        caches.append(cache)
    eager_cache, graph_cache = caches
    pool = CudaGraphPool(
        TorchCudaGraphBackend(dev), batch_buckets=(batch,), kv_buckets=kv_len_buckets(max_len, 64)
    )
    graphed = GraphedForward(model, graph_cache, batch, pool)
    ids = torch.randint(0, vocab, (batch, 1), generator=g).to(dev)

    def eager():
        return model(ids, cache=eager_cache, slots=slots).logits

    def graph():
        return graphed(ids, slots).logits

    diff = float((eager().float() - graph().float()).abs().max())
    try:  # a diagnostic: a profiler that fails on some runtime must not cost the timings
        kernels = profile_kernels(eager, model.config.num_hidden_layers)
    except Exception as e:  # noqa: BLE001
        kernels = {"error": f"{type(e).__name__}: {e}"}
    for _ in range(3):
        eager()
        graph()
    times: dict[str, list[float]] = {"eager": [], "graph": []}
    for r in range(rounds):
        for name in ("eager", "graph") if r % 2 == 0 else ("graph", "eager"):
            fn = eager if name == "eager" else graph
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            for _ in range(steps):
                fn()
            torch.cuda.synchronize(dev)
            times[name].append((time.perf_counter() - t) / steps)
    eager_ms, graph_ms = _median_ms(times["eager"]), _median_ms(times["graph"])
    return {
        "forward_eager_ms": eager_ms,
        "forward_graph_ms": graph_ms,
        "forward_speedup": eager_ms / graph_ms,
        "forward_max_abs_logit_diff": diff,
        "forward_graph_keys": [k._asdict() for k in pool.keys()],
        "forward_kernels": kernels,
    }


def describe_kernels(k: dict) -> str:
    """One line for ``profile_kernels``' result."""
    if "error" in k:
        return f"kernel profile failed ({k['error']})"
    return (
        f"{k['kernels_per_layer']:.1f} kernels a layer, device time GEMM {k['gemm_us'] / 1e3:.2f} ms + "
        f"other {k['other_us'] / 1e3:.2f} ms"
    )


def is_gemm(kernel: str) -> bool:
    """Whether a CUDA kernel name is a matrix product's: cuBLAS / cuBLASLt (on Hopper their kernels are named
    ``nvjet_*``), CUTLASS, GEMM or GEMV."""
    n = kernel.lower()
    if any(
        a in n for a in ("fmha", "attention", "flash")
    ):  # attention kernels (CUTLASS-templated): not weights
        return False
    return any(s in n for s in ("gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas"))


def profile_kernels(fn, layers: int, top: int = 24) -> dict:
    """The GPU kernels of one call of ``fn`` (an eager forward), from ``torch.profiler``: how many, per decoder
    layer, and their summed device time split into matrix products (cuBLAS / cuBLASLt GEMM and GEMV kernels)
    and the rest; ``top``: the kernels with the most summed time. A graph replays the same kernels, so the
    count says how many launches a graph holds and the rest's share says what fusion could save."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            by_name.setdefault(e.name, []).append(e.time_range.elapsed_us())
    count = sum(len(v) for v in by_name.values())
    gemm_us = sum(sum(v) for k, v in by_name.items() if is_gemm(k))
    other_us = sum(sum(v) for k, v in by_name.items() if not is_gemm(k))
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": count,
        "kernels_per_layer": count / layers,
        "gemm_us": gemm_us,
        "other_us": other_us,
        "top": [{"name": k[:120], "calls": len(v), "us": sum(v)} for k, v in ranked],
    }


def time_decode_attention(
    cfg: ModelConfig, batch: int, context: int, dtype: torch.dtype, reps: int = 20
) -> dict:
    """Microseconds per decode attention call (one query token per row, ``context`` cached keys, the graphs'
    key-length bucket above it), replayed ``reps`` x ``num_hidden_layers`` times from one CUDA graph, for:
    ``sdpa`` (the model's: grouped rows, additive mask, SDPA's memory-efficient kernel), ``math`` (the same
    rows as two batched products and a softmax in fp32) and ``flash_exact`` (FlashAttention over exactly the
    cached keys, no mask: what a kernel taking per-row key lengths could reach)."""
    dev = torch.device("cuda")
    h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = h // kv
    keys = next(e for e in kv_len_buckets(1 << 20, 64) if e >= context + 1)
    q = torch.randn(batch, h, 1, d, device=dev, dtype=dtype)
    k = torch.randn(batch, kv, keys, d, device=dev, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.zeros(batch, 1, g, keys, device=dev, dtype=dtype)
    mask[..., context + 1 :] = float("-inf")
    scale = d**-0.5
    qg, ke, ve = q.reshape(batch, kv, g, d), k[:, :, : context + 1], v[:, :, : context + 1]

    def math():
        w = torch.softmax(torch.matmul(qg, k.transpose(-1, -2)).float() * scale + mask, -1)
        return torch.matmul(w.to(dtype), v)

    def flash():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qg, ke, ve)

    variants = {"sdpa": lambda: grouped_attention(q, k, v, mask), "math": math, "flash_exact": flash}
    ref = variants["sdpa"]().float().reshape(batch, kv, g, d)
    out = {"keys": keys}
    for name, fn in variants.items():
        try:
            err = float((fn().float().reshape(batch, kv, g, d) - ref).abs().max())
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(cfg.num_hidden_layers):
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
            out[name] = {
                "us": 1e6 * (time.perf_counter() - t) / (reps * cfg.num_hidden_layers),
                "max_diff": err,
            }
        except Exception as e:  # noqa: BLE001  (a variant this GPU or build lacks)
            out[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
    return out


def time_engine(model: Transformer, batch: int, context: int, steps: int, seed: int) -> dict:
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    engines = {}
    for mode in ("eager", "graph"):
        eng = Engine(
            model,
            max_batch_size=batch,
            max_seq_len=context + steps + 16,
            eos_token_ids=[],
            cuda_graphs=mode == "graph",
        )
        g.manual_seed(seed)  # same prompts for both
        for i in range(batch):
            prompt = torch.randint(0, vocab, (context,), generator=g).tolist()
            eng.add_request(GenerationRequest(str(i), prompt, SamplingParams(0.0, max_new_tokens=steps + 4)))
        engines[mode] = eng
    for _ in range(steps):
        for eng in engines.values():
            eng.step()
    tokens = {m: [list(r.tokens) for r in e.running] for m, e in engines.items()}
    secs = {m: [s.seconds for s in e.step_log[3:]] for m, e in engines.items()}
    eager_ms, graph_ms = _median_ms(secs["eager"]), _median_ms(secs["graph"])
    stats = engines["graph"].graphed.pool.stats
    return {
        "engine_step_eager_ms": eager_ms,
        "engine_step_graph_ms": graph_ms,
        "engine_speedup": eager_ms / graph_ms,
        "engine_same_tokens": tokens["eager"] == tokens["graph"],
        "engine_steps_timed": len(secs["graph"]),
        "engine_graph_stats": vars(stats),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 3.8 * len(models)), squeeze=False)
    for row, (name, m) in enumerate(models.items()):
        rows = m["rows"]
        b = [r["batch"] for r in rows]
        ax = axes[row][0]
        ax.plot(b, [r["forward_eager_ms"] for r in rows], "o-", color="tab:gray", label="forward, eager")
        ax.plot(b, [r["forward_graph_ms"] for r in rows], "o-", color="tab:blue", label="forward, CUDA graph")
        ax.plot(
            b, [r["engine_step_eager_ms"] for r in rows], "s--", color="tab:gray", label="engine step, eager"
        )
        ax.plot(
            b, [r["engine_step_graph_ms"] for r in rows], "s--", color="tab:blue", label="engine step, graph"
        )
        if "engine_step_bound_ms" in rows[0]:
            ax.plot(b, [r["engine_step_bound_ms"] for r in rows], ":", color="black", label="memory bound")
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.set_xlabel("batch (requests)")
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"{name} ({m['dtype']}, context {result['context']})")
        ax.legend(fontsize=8)
        ax = axes[row][1]
        ax.plot(b, [r["forward_speedup"] for r in rows], "o-", color="tab:blue", label="forward")
        ax.plot(b, [r["engine_speedup"] for r in rows], "s--", color="tab:orange", label="engine step")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.set_xlabel("batch (requests)")
        ax.set_ylabel("eager time / graph time")
        ax.set_title(f"{name}: speed-up from CUDA graphs")
        ax.legend(fontsize=8)
    fig.suptitle(f"CUDA graphs for plain decode ({result['gpu']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="base_policy,qwen2-0.5b")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--context", type=int, default=200, help="tokens in each request's KV cache")
    ap.add_argument("--steps", type=int, default=50, help="forward steps per timed round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--engine-steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        result = {
            "benchmark": "cuda_graphs",
            "skipped": True,
            "reason": "no CUDA",
            "torch_version": torch.__version__,
        }
        print("skipped: no CUDA")
        print(json.dumps(result, indent=2))
        previous = json.loads(args.out.read_text()) if args.out.exists() else {"skipped": True}
        if previous.get("skipped", False):  # never overwrite a measured result with a skip
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0

    dev = torch.device("cuda")
    batches = [int(x) for x in args.batches.split(",")]
    bw = measure_memory_bandwidth(mib=2048, repeats=10, device=dev)
    gbps = max(bw["read_gbps_best"], bw["copy_gbps_best"])
    print(
        f"memory bandwidth: read {bw['read_gbps_best']:.0f} GB/s, copy {bw['copy_gbps_best']:.0f} GB/s",
        flush=True,
    )
    result = {
        "benchmark": "cuda_graphs",
        "skipped": False,
        "gpu": torch.cuda.get_device_name(dev),
        "cuda_version": torch.version.cuda,
        "machine": describe_machine(),
        "context": args.context,
        "forward_steps_per_round": args.steps,
        "rounds": args.rounds,
        "engine_steps": args.engine_steps,
        "memory_bandwidth": bw,
        "bound_gbps": gbps,
        "models": {},
    }
    for name in args.models.split(","):
        model, dtype = load_model(name, dev)
        fuse_projections(model)  # as the engine does: every row measures the engine's forward
        rows = []
        for b in batches:
            row = {"batch": b}
            row.update(time_forward(model, b, args.context, args.steps, args.rounds, args.seed + b))
            row.update(time_engine(model, b, args.context, args.engine_steps, args.seed + b))
            row["decode_attention"] = time_decode_attention(
                model.config, b, args.context, model.lm_head.weight.dtype
            )
            # the forward attends ``context`` cached tokens; the engine's steps ``context`` + 3 .. + steps
            for key, ctx in (
                ("forward", args.context),
                ("engine_step", args.context + args.engine_steps // 2),
            ):
                nbytes = decode_bytes(model, b, ctx)
                row[f"{key}_bound_ms"] = 1e3 * nbytes / (gbps * 1e9)
                row[f"{key}_bytes"] = nbytes
                row[f"{key}_graph_vs_bound"] = row[f"{key}_graph_ms"] / row[f"{key}_bound_ms"]
            rows.append(row)
            print(
                f"{name:12s} batch {b:3d}: forward {row['forward_eager_ms']:.3f} -> "
                f"{row['forward_graph_ms']:.3f} ms (x{row['forward_speedup']:.2f}); engine step "
                f"{row['engine_step_eager_ms']:.3f} -> {row['engine_step_graph_ms']:.3f} ms "
                f"(x{row['engine_speedup']:.2f}); "
                f"same tokens {row['engine_same_tokens']}; memory bound {row['engine_step_bound_ms']:.3f} ms "
                f"(engine step graph / bound {row['engine_step_graph_vs_bound']:.2f}x); "
                + describe_kernels(row["forward_kernels"])
                + f"; attention per call {row['decode_attention']}",
                flush=True,
            )
        result["models"][name] = {
            "dtype": dtype,
            "parameters": model.num_parameters(),
            "config": model.config.as_dict(),
            "rows": rows,
        }
        del model
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
