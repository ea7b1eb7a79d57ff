"""The decoding engine: continuous batching over a slot KV cache, with lossless speculative decoding.

Contract
--------
``Engine(model, ...).generate(requests) -> list[RequestOutput]`` (same order as ``requests``).

* Continuous batching: up to ``max_batch_size`` requests hold a KV-cache slot; a finished request frees its
  slot at once and the next waiting request is prefilled into it.
* Prompt sharing (``prefix_sharing``, on by default): the G responses of a GRPO group share one prompt, so a
  prompt is prefilled once while some slot still holds it: a request whose prompt a running request (or a
  freed slot not yet reused) holds gets that slot's prompt KV copied into its own slot (or keeps it, when it
  lands in that very slot) and samples its first token from the prompt's stored last-position logits. Same
  numbers as its own prefill up to float round-off (a different batch in the prefill matmuls).
* Sampling: temperature / top-k / top-p via ``sampling.processed_probs`` (temperature 0 = greedy); stop on
  an EOS id, a stop string, or ``max_new_tokens``. Each request owns a ``torch.Generator`` seeded from its
  ``seed``, so the same seed and prompt give the same tokens whatever else is in the batch. At admission it
  draws one uniform per output position (``max_new_tokens + 1``); the token at position t is drawn with
  uniform t, by plain decoding and by speculative verification alike (``verify_tree(coupled=True)``), so a
  deterministic drafter (suffix, n-gram, greedy heads) changes how fast, never which, tokens are emitted
  (up to float round-off between a verify and a decode forward). Sampled drafts (``probs`` set) are verified
  by the sequential rule with further uniforms from the generator.
* Speculation: per decode step the ``StrategySelector`` gives every request a ``Strategy`` (or, under the
  selector's ``Lease``, the step is plain and the selector is not asked: ``speculative/strategy.py``); the named
  drafter proposes a chain or tree; all requests are verified in ONE batched target forward (tree attention
  masks); ``speculative.verify.verify_tree`` applies the lossless acceptance rule; rejected KV positions are
  rolled back (only the slot length moves) and an accepted tree path is compacted in place.
* Trace replay: a request with ``reference`` (token ids) emits exactly that response, then EOS: the token drawn
  at each of its output positions is replaced, after the draw, by the trace's token there (``verify_tree``'s
  ``forced``; a plain step's likewise), so the coupled rule accepts a deterministic draft token iff it equals
  the trace's and the bonus token is the trace's next. Drafters, tuner, KV cache, batching, rollback, every
  forward and every draw run and cost what they cost; only the choice of token comes from the trace
  (benchmarks replay real rollouts through a model of the real shape with random weights). Sampled drafts are
  not replayable (their acceptance depends on the target distribution, which the trace does not give):
  proposing one for a replay request raises ``ValueError``.
* Outputs: token ids, per-token logprobs (log-softmax of logits / temperature, before top-k/top-p; raw
  logits at temperature 0), finish reason (``eos`` | ``stop`` | ``length``), per-request timings and
  speculation counters. ``Engine.step_log`` keeps one ``StepRecord`` per decode step (active batch size,
  seconds, drafted/accepted tokens) for long-tail plots and the tuner.
* Device: the model's. On CUDA the decode and verify forwards replay CUDA graphs from a bucketed pool
  (``cuda_graphs.py``; prefill eager); q / k / v and gate / up run as fused products (``fused.py``).

Run it on a model folder:

    python -m services.rollout_actor.engine --model services/pipeline/assets/base_policy --n 8
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from services.rollout_actor.admission import AdmissionMixin
from services.rollout_actor.cuda_graphs import (
    DEFAULT_BATCH_BUCKETS,
    CudaGraphPool,
    GraphBackend,
    GraphedForward,
    TorchCudaGraphBackend,
    kv_len_buckets,
)
from services.rollout_actor.fused import fuse_projections
from services.rollout_actor.model import Transformer
from services.rollout_actor.requests import (
    GenerationRequest,
    RequestOutput,
    RunningRequest,
    SamplingParams,
    StepRecord,
)
from services.rollout_actor.sampling import SamplingBatch, logprobs, sample_from_probs
from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree
from services.rollout_actor.speculative.strategy import (
    OFF,
    FixedStrategy,
    Lease,
    LeaseSample,
    StepObservation,
    Strategy,
    StrategySelector,
)
from services.rollout_actor.speculative.verify import verify_tree
from services.rollout_actor.verify_step import (
    VerifyBatch,
    build_verify_batch,
    chain_accepted,
    committed_hidden,
    committed_logprobs,
    committed_rows,
    fit_drafts,
    propose_drafts,
    record_spec,
)


class Engine(AdmissionMixin):
    """Batched, continuously batched decoding over one ``Transformer``.

    Args:
        model: the target policy (eval mode; runs under ``torch.inference_mode``).
        max_batch_size: KV-cache slots (most requests decoded at once).
        max_seq_len: per-slot capacity (prompt + generated + draft), in tokens.
        eos_token_ids: ids that end a response (default: the model config's eos ids).
        tokenizer: optional ``tokenizers.Tokenizer``-like object with ``decode(ids)``; needed for stop strings
            and ``RequestOutput.text``.
        drafters: name -> ``Drafter`` available to strategies.
        selector: per-step ``StrategySelector`` (default: speculation off).
        hidden_layers: target layers whose hidden states the learned drafter reads (``num_hidden_layers`` =
            the final normed state). Empty: no hidden states are kept.
        hidden_sink: optional callback ``(request_id, positions [n], tokens [n], hidden [n, k, H])`` receiving,
            for every committed position, the token read there and the target hidden states after reading it
            (the spot trainer's buffer feeds on it; prompt positions are not reported). ``hidden`` is a fresh
            tensor the engine does not touch again.
        hidden_filter: optional ``request_id -> bool``, asked once per request at admission: only the requests
            it accepts go to ``hidden_sink`` (None: every request). The others cost the sink nothing.
        seed: base seed for requests without their own.
        cuda_graphs: replay the decode / verify forwards from a ``CudaGraphPool`` (one extra KV-cache slot
            takes the padding rows). None: on when the model is on CUDA. True on a non-CUDA model raises
            unless ``graph_backend`` is given.
        cuda_graph_memory_bytes: device-memory budget of the captured graphs, in bytes.
        graph_backend: the ``GraphBackend`` capturing the graphs (default ``TorchCudaGraphBackend``); tests
            pass a fake one to run the graph path (padding, buckets, static key lengths) on CPU.
        prefix_sharing: prefill a prompt once while a slot holds it (module docstring); False prefills every
            request (A/B, tests).
        cpu_clock: also record each step's process CPU time (``StepRecord.cpu_seconds``; two more clock reads).
        draft_headroom: KV-cache positions per slot past ``max_seq_len``. A verify step writes the longest
            draft + 1 positions for every request (padding included), so a request near ``max_seq_len`` next to
            a batch-mate drafting k tokens needs k + 1 positions beyond its own; drafts longer than the
            headroom allows are cut for that step (never an overflow).
    """

    def __init__(
        self,
        model: Transformer,
        max_batch_size: int = 64,
        max_seq_len: int = 1024,
        eos_token_ids: Sequence[int] | None = None,
        tokenizer=None,
        drafters: dict[str, Drafter] | None = None,
        selector: StrategySelector | None = None,
        hidden_layers: Sequence[int] = (),
        hidden_sink: Callable[..., None] | None = None,
        hidden_filter: Callable[[str], bool] | None = None,
        seed: int = 0,
        cuda_graphs: bool | None = None,
        cuda_graph_memory_bytes: int = 1 << 30,
        graph_backend: GraphBackend | None = None,
        prefix_sharing: bool = True,
        cpu_clock: bool = False,
        draft_headroom: int = 64,
    ):
        self.model = model.eval()
        fuse_projections(model)
        self.cfg = model.config
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        eos = list(eos_token_ids if eos_token_ids is not None else self.cfg.eos_ids())
        self.eos = set(eos)
        self.replay_eos = eos[0] if eos else None  # what a replay request emits after its trace
        self.tokenizer = tokenizer
        self.drafters = dict(drafters or {})
        self.selector = selector or FixedStrategy()
        self.cpu_clock = bool(cpu_clock)
        self.hidden_layers = tuple(hidden_layers)
        self.hidden_sink = hidden_sink
        self.hidden_filter = hidden_filter
        self.seed = seed
        self._seed_counter = itertools.count()
        self.device = next(model.parameters()).device
        cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if cuda_graphs and self.device.type != "cuda" and graph_backend is None:
            raise ValueError(f"cuda_graphs needs the model on CUDA, it is on {self.device}")
        # with graphs, slot max_batch_size is the scratch slot the padding rows of a batch bucket write to
        if draft_headroom < 0:
            raise ValueError(f"draft_headroom must be >= 0, got {draft_headroom}")
        self.cache = model.new_cache(max_batch_size + int(cuda_graphs), max_seq_len + draft_headroom)
        self.graphed: GraphedForward | None = None
        if cuda_graphs:
            pool = CudaGraphPool(
                graph_backend or TorchCudaGraphBackend(self.device),
                batch_buckets=[e for e in DEFAULT_BATCH_BUCKETS if e < max_batch_size] + [max_batch_size],
                kv_buckets=kv_len_buckets(self.cache.max_len),
                memory_budget_bytes=cuda_graph_memory_bytes,
            )
            self.graphed = GraphedForward(model, self.cache, max_batch_size, pool, self.hidden_layers)
        self.free_slots: list[int] = list(range(max_batch_size - 1, -1, -1))
        self.waiting: deque[tuple[GenerationRequest, float]] = deque()
        self.running: list[RunningRequest] = []
        self.step_log: list[StepRecord] = []
        self.clock_origin = time.perf_counter()
        # prompt sharing: which prompt each slot's KV rows [0, len(prompt)) hold (running or freed, until the
        # slot is reused), the slots holding each prompt, and each held prompt's last-position logits [V] and
        # hidden state(s) (None without hidden_layers)
        self.prefix_sharing = bool(prefix_sharing)
        self._slot_prompt: dict[int, tuple[int, ...]] = {}
        self._holders: dict[tuple[int, ...], list[int]] = {}
        self._prompt_out: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.prefill_tokens = 0  # prompt tokens run through the model (prompt sharing skips the rest)
        self.shared_prompts = 0  # requests whose prompt KV was copied or kept instead of prefilled

    # ------------------------------------------------------------------ public API
    @property
    def selector(self) -> StrategySelector:
        return self._selector

    @selector.setter
    def selector(self, selector: StrategySelector) -> None:
        self._selector = selector
        self._lease: Lease | None = None  # the selector's, once it has been asked (strategy.py: leases)

    def now(self) -> float:
        return time.perf_counter() - self.clock_origin

    def add_request(self, req: GenerationRequest) -> None:
        """Queue a request. Raises ValueError if it cannot fit a slot or its parameters are invalid."""
        p = req.params
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id!r}: empty prompt")
        if p.max_new_tokens < 1:
            raise ValueError(f"request {req.request_id!r}: max_new_tokens must be >= 1")
        if p.temperature < 0 or not (0 < p.top_p <= 1) or p.top_k < 0:
            raise ValueError(f"request {req.request_id!r}: invalid sampling params {p}")
        if p.stop and self.tokenizer is None:
            raise ValueError(f"request {req.request_id!r}: stop strings need a tokenizer")
        need = len(req.prompt_ids) + p.max_new_tokens + 1
        if need > self.max_seq_len:
            raise ValueError(
                f"request {req.request_id!r}: prompt ({len(req.prompt_ids)}) + max_new_tokens "
                f"({p.max_new_tokens}) exceeds max_seq_len {self.max_seq_len}"
            )
        bad = [t for t in req.prompt_ids + (req.reference or []) if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(
                f"request {req.request_id!r}: token id {bad[0]} outside the vocabulary "
                f"(size {self.cfg.vocab_size}); tokenizer and model do not match"
            )
        if req.reference is not None and self.replay_eos is None:
            raise ValueError(
                f"request {req.request_id!r}: trace replay needs an EOS id (the engine has none)"
            )
        self.waiting.append((req, self.now()))
        for d in self.drafters.values():
            d.start_request(req.request_id, req.problem_id, list(req.prompt_ids))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def generate(
        self, requests: Sequence[GenerationRequest], on_finish: Callable[[RequestOutput], None] | None = None
    ) -> list[RequestOutput]:
        """Decode ``requests`` to completion; outputs in the same order. Prompts held from an earlier call are
        forgotten first (the weights may have changed in between)."""
        self.start(requests)
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                done[out.request_id] = out
                if on_finish is not None:
                    on_finish(out)
        return [done[r.request_id] for r in requests]

    def start(self, requests: Sequence[GenerationRequest]) -> None:
        """Begin a rollout: restart the engine clock, forget held prompts when nothing is running (the weights
        may have changed since), queue ``requests``. ``generate`` = ``start`` + ``step`` until done; callers
        that drive ``step`` themselves (several engines side by side) call it directly."""
        self.clock_origin = time.perf_counter()
        if not self.running:
            self.forget_prompts()
        for r in requests:
            self.add_request(r)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Admit + prefill waiting requests, then one decode (or draft + verify) step for all running ones."""
        finished = self._admit()
        if self.running:
            finished += self._decode_step()
        return finished

    # ------------------------------------------------------------------ internals
    def _sampling(self, rows: list[RunningRequest]) -> SamplingBatch:
        return SamplingBatch.of([r.req.params for r in rows], self.cfg.vocab_size, self.device)

    def _sample_rows(
        self, logits: torch.Tensor, rows: list[RunningRequest], sampling: SamplingBatch | None = None
    ) -> tuple[list[int], list[float]]:
        """Each row's next token and its logprob from ``logits [B, V]`` (the first token after a prompt, or a
        plain step): greedy rows take the argmax, the others draw with the uniform of their next output position,
        as ``_verify`` does for a step with drafts; then replay rows take their trace's token (after the draw, so
        that a replayed step costs what a sampled one does). One device read."""
        sampling = sampling or self._sampling(rows)
        if all(sampling.greedy):
            tok = logits.argmax(-1)  # processed_probs' one-hot on the argmax (ties: lowest id)
        else:
            u = torch.stack([r.u_pos[len(r.tokens)] for r in rows]).to(self.device)
            tok = sample_from_probs(sampling.probs(logits), u)
        if any(r.req.reference is not None for r in rows):  # as ``_verify``: only batches holding a replay
            ref = torch.tensor([self._trace(r, 1)[0] for r in rows], device=self.device)
            tok = torch.where(ref >= 0, ref, tok)
        lp = logprobs(logits, sampling.temperature).gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        both = torch.stack([tok.double(), lp.double()]).tolist()  # exact for ids < 2**53 and fp32 values
        return [int(t) for t in both[0]], both[1]

    def _commit(self, r: RunningRequest, tokens: list[int], logps: list[float]) -> None:
        """Append newly committed tokens, applying EOS / stop-string / length stops."""
        p = r.req.params
        for tok, lp in zip(tokens, logps):
            r.tokens.append(tok)
            r.logprobs.append(lp)
            if tok in self.eos:
                r.finish_reason = "eos"
                break
            if len(r.tokens) >= p.max_new_tokens:
                r.finish_reason = "length"
                break
            if p.stop and self._hit_stop(r):
                r.finish_reason = "stop"
                break
        r.root = r.tokens[-1]

    def _hit_stop(self, r: RunningRequest) -> bool:
        longest = max(len(s) for s in r.req.params.stop)
        tail = self.tokenizer.decode(r.tokens[-(longest + 8) :])
        return any(s in tail for s in r.req.params.stop)

    def _finish(self, r: RunningRequest) -> RequestOutput:
        r.timings.finish_s = self.now()
        self.running.remove(r)
        self.free_slots.append(r.slot)
        for d in self.drafters.values():
            d.finish_request(r.req.request_id, r.req.problem_id, list(r.tokens))
        text = self.tokenizer.decode(r.tokens) if self.tokenizer is not None else None
        return RequestOutput(
            r.req.request_id,
            r.req.problem_id,
            list(r.req.prompt_ids),
            r.tokens,
            r.logprobs,
            r.finish_reason or "length",
            r.timings,
            r.spec,
            text,
        )

    # ------------------------------------------------------------------ decode / speculate
    def _decode_step(self) -> list[RequestOutput]:
        """One decode step for every running request: propose -> build the verify batch -> one target forward
        -> verify -> commit. A plain step is the same with empty drafts (a batch of width 1)."""
        c0 = time.process_time() if self.cpu_clock else 0.0
        t0 = time.perf_counter()
        capture0 = self.graphed.pool.stats.capture_seconds if self.graphed is not None else 0.0
        # in slot order: a full batch then occupies consecutive slots and the forward reads the KV cache as a
        # view instead of gathering a copy per layer
        rows = sorted(self.running, key=lambda r: r.slot)
        lease, sampled, strategies, drafts = self._propose_step(rows)
        tt0 = time.thread_time() if sampled else 0.0
        t_draft = time.perf_counter() - t0
        batch = self._build_verify_batch(rows, strategies, drafts)
        tf = time.perf_counter()
        out = self._forward(batch)
        t_forward = time.perf_counter() - tf
        if batch.n:
            nxt, paths = self._verify(batch, batch.sampling.probs(out.logits))
        else:  # a plain step: sample each row's next token, as admission samples the first
            nxt, lps = self._sample_rows(out.logits[:, 0], rows, batch.sampling)
            paths = [[] for _ in rows]
        rows_idx, toks = committed_rows(batch, nxt, paths)
        logps = committed_logprobs(batch, out.logits, rows_idx, toks) if batch.n else [[lp] for lp in lps]
        finished, committed, drafted, accepted = self._commit_step(batch, out, paths, rows_idx, toks, logps)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0 if self.cpu_clock else None
        captured = self.graphed.pool.stats.capture_seconds - capture0 if self.graphed is not None else 0.0
        b = len(rows)
        if lease is not None:
            arm = OFF.name
            if sampled:
                lease.samples.append(
                    LeaseSample(b, committed, seconds, time.thread_time() - tt0, captured, lease.left)
                )
        else:
            arm = strategies[0].name if len({s.name for s in strategies}) == 1 else "mixed"
        self.step_log.append(
            StepRecord(
                t0 - self.clock_origin,
                seconds,
                b,
                arm,
                committed,
                drafted,
                accepted,
                t_draft,
                captured,
                lease is not None,
                cpu,
                t_forward,
            )
        )
        if lease is None:
            selector = self._selector
            drafts = tuple(len(d) for d in batch.drafts)
            chains = tuple(chain_accepted(d, p) for d, p in zip(batch.drafts, paths))
            selector.observe(
                StepObservation(b, arm, committed, drafted, accepted, seconds, captured, drafts, chains)
            )
            self._lease = getattr(selector, "lease", None)
        return finished

    def _propose_step(
        self, rows: list[RunningRequest]
    ) -> tuple[Lease | None, bool, list[Strategy], list[DraftTree]]:
        """The step's strategies and drafts: under the selector's lease a plain step, not asked (strategy.py:
        leases; ``sampled``: the lease times this step for the selector); else ``selector.choose`` then
        propose.
        Returns (lease or None, sampled, strategies [B], drafts [B])."""
        b = len(rows)
        lease = self._lease
        if lease is not None and not (lease.left > 0 and lease.lo <= b < lease.hi):
            lease = self._lease = None  # spent, or another batch size: ask the selector
        if lease is not None:
            return lease, lease.take(), [OFF] * b, [DraftTree() for _ in rows]
        dreqs = [
            DraftRequest(
                r.req.request_id,
                r.req.problem_id,
                r.req.prompt_ids + r.tokens,
                len(r.req.prompt_ids),
                r.hidden,
            )
            for r in rows
        ]
        strategies = self._selector.choose(dreqs)
        drafts = propose_drafts(self.drafters, rows, dreqs, strategies, self.cache.lengths, self.max_seq_len)
        return None, False, strategies, drafts

    def _build_verify_batch(
        self, rows: list[RunningRequest], strategies: list[Strategy], drafts: list[DraftTree]
    ) -> VerifyBatch:
        """Inputs of the verify forward (``verify_step.py``), padded to the longest draft + 1. Every row writes
        N + 1 cache positions; the cache has ``draft_headroom`` positions past ``max_seq_len`` for them, and a
        draft that would still overflow some row's slot is cut to fit (``fit_drafts``)."""
        slots = torch.tensor([r.slot for r in rows], device=self.device)
        base = self.cache.lengths[slots]
        drafts = fit_drafts(drafts, base, self.cache.max_len)
        return build_verify_batch(rows, strategies, drafts, slots, base, self._sampling(rows))

    def _forward(self, batch: VerifyBatch):
        ids = torch.tensor(batch.id_rows, device=self.device)
        if self.graphed is not None:
            return self.graphed(ids, batch.slots, positions=batch.positions, attn_mask=batch.mask)
        return self.model(
            ids,
            positions=batch.positions,
            cache=self.cache,
            slots=batch.slots,
            attn_mask=batch.mask,
            hidden_layers=self.hidden_layers,
            row_lengths=[len(d) + 1 for d in batch.drafts] if batch.n else None,  # packed when it pays
        )

    def _verify(self, batch: VerifyBatch, probs: torch.Tensor) -> tuple[list[int], list[list[int]]]:
        """Apply the lossless acceptance rule to the target distribution ``probs [B, N+1, V]``
        (``SamplingBatch.probs``), a replay row's draws forced to its trace (module docstring). Returns (the
        token each row samples after its accepted nodes [B], each row's accepted node indices)."""
        rows, drafts, b = batch.rows, batch.drafts, len(batch.rows)
        # Deterministic drafts: the uniforms of the positions this step can reach (coupled rule: the token at
        # position t is drawn with uniform t, as plain decoding draws it). Sampled drafts: len(draft) + 1 fresh
        # uniforms from the request's generator for the sequential rule. Either way the count depends on the
        # request alone (verify.py's contract), never on its batch mates.
        u = torch.zeros(b, batch.n + 1)
        for i, (r, d) in enumerate(zip(rows, drafts)):
            k = len(d) + 1
            if d.probs is None:
                seg = r.u_pos[len(r.tokens) : len(r.tokens) + k]
                if len(seg) < k:  # a draft past max_new_tokens (drafters get a budget that prevents it)
                    seg = torch.cat([seg, torch.rand(k - len(seg), generator=r.gen)])
                u[i, :k] = seg
            else:
                u[i, :k] = torch.rand(k, generator=r.gen)
        greedy = batch.sampling.temperature <= 0
        forced = None
        if any(r.req.reference is not None for r in rows):  # depth d: output position len(tokens) + d
            forced = torch.tensor([self._trace(r, batch.n + 1) for r in rows], device=probs.device)
        res = verify_tree(probs, drafts, u, greedy=greedy, coupled=True, forced=forced)
        return res.next_token.tolist(), res.accepted_nodes

    def _commit_step(
        self,
        batch: VerifyBatch,
        out,
        paths: list[list[int]],
        rows_idx: list[list[int]],
        toks: list[list[int]],
        logps: list[list[float]],
    ) -> tuple[list[RequestOutput], int, int, int]:
        """Commit each row's accepted nodes (``paths``) and next token: the committed tokens ``toks``, the input
        rows that predicted them ``rows_idx`` (``committed_rows``) and their logprobs ``logps``. KV (roll back the
        rest, compact a tree path), logprobs, hidden states, counters, stops. Returns (finished outputs,
        committed, drafted, accepted)."""
        rows, drafts, dev = batch.rows, batch.drafts, self.device
        # KV: keep root + accepted nodes. A path 0, 1, 2, ... is already in place (the common case: only the
        # length moves); a tree path is compacted into consecutive positions.
        contiguous = [path == list(range(len(path))) for path in paths]
        if batch.n:
            keep = torch.tensor([len(ri) if c else 0 for ri, c in zip(rows_idx, contiguous)], device=dev)
            self.cache.commit(batch.slots, keep)
        else:  # a plain step keeps its one written position in every row
            self.cache.commit(batch.slots, 1)
        for r, ri, c in zip(rows, rows_idx, contiguous):
            if not c:
                self.cache.keep_path(r.slot, ri)
        last_hid, to_sink = None, {}
        if self.hidden_layers:
            hs = [out.hidden[layer] for layer in self.hidden_layers]  # each [B, n+1, H]
            last_hid, to_sink = committed_hidden(hs, rows_idx, [i for i, r in enumerate(rows) if r.to_sink])
        finished: list[RequestOutput] = []
        committed = drafted = accepted = 0
        for i, (r, d, s) in enumerate(zip(rows, drafts, batch.strategies)):
            path, ri, tk, lps = paths[i], rows_idx[i], toks[i], logps[i]
            if last_hid is not None:
                r.hidden = last_hid[i]
            if i in to_sink:
                # committed positions, the token read at each (root, accepted nodes), and the hidden state
                # after reading it: EAGLE's (token_t, feature_t) rows, consecutive per request
                start = int(batch.base[i])
                self.hidden_sink(
                    r.req.request_id,
                    list(range(start, start + len(ri))),
                    [batch.id_rows[i][j] for j in ri],
                    to_sink[i],
                )
            record_spec(r.spec, d, s.drafter, len(path))
            r.timings.decode_steps += 1
            before = len(r.tokens)
            self._commit(r, tk, lps)
            committed += len(r.tokens) - before
            drafted += len(d)
            accepted += len(path)
            for dr in self._drafters_of(s):
                dr.observe(r.req.request_id, r.tokens[before:])
            if r.finish_reason:
                finished.append(self._finish(r))
        return finished, committed, drafted, accepted

    def _trace(self, r: RunningRequest, n: int) -> list[int]:
        """The tokens a replay request emits at its next ``n`` output positions: its trace's, then EOS; ``n``
        times -1 for a request without a trace."""
        if r.req.reference is None:
            return [-1] * n
        t = len(r.tokens)
        seg = list(r.req.reference[t : t + n])
        return seg + [self.replay_eos] * (n - len(seg))

    def _drafters_of(self, s: Strategy) -> list[Drafter]:
        if s.is_off:
            return []
        d = self.drafters.get(s.drafter)
        return [d] if d is not None else []


def _main(argv=None) -> None:
    import argparse

    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", default="Question: Tom has 3 apples and buys 5 more. How many now?\nAnswer:")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.9)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    args = ap.parse_args(argv)
    model = Transformer.from_pretrained(args.model)
    tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    eng = Engine(model, tokenizer=tok, max_seq_len=1024)
    ids = tok.encode(args.prompt).ids
    reqs = [
        GenerationRequest(
            str(i), ids, SamplingParams(args.temperature, max_new_tokens=args.max_new_tokens, seed=i)
        )
        for i in range(args.n)
    ]
    for o in eng.generate(reqs):
        print(f"--- {o.request_id} ({len(o.token_ids)} tokens, {o.finish_reason})\n{o.text}")


if __name__ == "__main__":
    _main()
