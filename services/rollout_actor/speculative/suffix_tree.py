"""Suffix-tree drafter: nonparametric drafts from the request itself, its GRPO group, and recent rollouts.

After SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; ArcticInference / vLLM ``suffix``) and DAS
(arXiv 2511.13841). Deterministic drafter: every ``DraftTree`` it returns has ``probs = None``. The tries and
the walks that draft from them are in ``suffix_trie``.

Sources
-------
Three counted suffix tries (every suffix of every indexed sequence, truncated to ``max_depth`` = D tokens):

* **request**: per running request, over its own prompt + output so far, built at the request's first
  ``propose`` (``start_request`` only keeps the prompt: indexing it costs ~1-2 ms of Python per request, all
  of it wasted on requests that are never drafted, e.g. every request of a rollout the tuner keeps off);
  ``observe`` appends committed tokens, and ``propose`` catches up from ``DraftRequest.token_ids`` when
  some tokens were never observed (the engine only calls ``observe`` on the step's drafter).
* **problem**: per ``problem_id``, the finished responses to that prompt (GRPO siblings as they finish,
  plus earlier RL steps). ``finish_request`` only queues a response (it runs on the engine's decode
  thread, also in steps where speculation is off). A problem's queue is indexed incrementally by the
  ``propose`` calls of its requests, at most ``index_budget`` suffixes per ``propose`` call in all (suffix
  starts in order, so a sibling's beginning is served first), and whatever is left by ``flush``: an
  8k-token sibling costs ~20 ms to index, which at once would stall one decode step; bounded, it is spread
  over ~30 steps of < 1 ms each, while a short sibling (<= ``index_budget`` tokens) is still whole at the
  first ``propose`` after it finished. (The alternative, indexing siblings only in the background ``flush``
  after a rollout, would hide a rollout's finished siblings from its own long tail, the requests that
  profit most.) ``last_index_work`` is the number of suffixes the last ``propose`` indexed. A response stays
  while it is one of the last ``problem_capacity`` of its problem and was added in one of the problem's last
  ``window_steps`` (W) *visits* (RL steps that added a response to it): a problem that comes back once per
  epoch keeps its earlier epochs' responses (DAS's setting), however many steps an epoch takes. The problem
  source holds at most ``history_capacity`` responses in all; beyond it the problem visited longest ago
  (whose newest response is the oldest) is dropped whole.
* **global**: the last ``global_capacity`` finished responses of all problems (FIFO over whole responses).
  Queued responses enter it at ``flush()`` (the rollout worker calls it after each rollout, in a background
  thread; ``new_step``, ``state_dict`` and ``stats`` flush too), so within one rollout the global source
  serves the earlier rollouts' responses.

A stored response is ``prompt[-(D - 1):] + output_ids``: the prompt tail lets a sibling that has generated
nothing yet draft the group's first tokens. ``add_history`` queues a response without a running request
(warm start from logged rollouts, offline evaluation: ``benchmarks/suffix_offline.py``).

Trie
----
A node's count ``n`` is the number of occurrences of its string; the probability of a child is
``count(child) / sum(count(children))`` (the parent's occurrences that continue; SuffixDecoding divides by
``count(parent)``, which differs only at sequence ends, i.e. for the growing request itself). Single-count
runs are one node (compressed), and eviction is exact: ``remove`` re-walks the sequence's suffixes, so the
counts always equal those of the sequences currently indexed (tested against brute force).

Propose (per request; ``max_tokens[i]`` = budget b)
--------------------------------------------------
1. Match, per source: the longest suffix of the context (length ``L <= cap``) that is a trie node with a
   continuation; none if ``L < min_match_len``. Chains: ``cap = D - 1``; trees: the largest ``L`` with
   ``L + min(b, floor(alpha * L + beta)) <= D`` (room for the tree below the match). Request source: read
   off the online trie for free (its active starts are exactly the suffixes that occurred earlier). History
   sources: a few root walks; each request remembers an upper bound of its last match per trie, valid after
   appending dn tokens as ``U + dn`` unless a sequence inserted since holds a longer match (checked with
   ``bytes.find`` in the trie's insertion log), so the steady state is one walk. These shortcuts never
   change a draft (tested against a freshly restored drafter).
2. Candidates: as SuffixDecoding, every match length ``L`` from the longest down to ``min_match_len`` is a
   candidate, and the best-scoring draft over all of them (and all sources) wins: a shorter match sees more
   occurrences and can predict better. Only lengths where the count of the matched string grows are scored
   (a shorter match with the same count has the same occurrences, so its draft is the longer one's, with a
   smaller size); the search stops at the first length whose size cannot beat the best score so far (sizes
   grow with ``L``), so a perfect long match costs one draft.
3. Size: ``k = min(b, floor(alpha * L + beta))`` draft nodes (``depth > 0`` also caps a chain's length).
4. Draft: ``width == 1``: a chain following the most frequent child (ties: lowest token id); at the trie's
   depth D it re-anchors on the longest suffix (<= D/2 tokens) of context + draft that the trie continues,
   so any budget up to (and past) D is usable. ``width > 1``: best-first tree, the frontier node of highest
   path probability next, each node offering its ``width`` most frequent children (siblings in verification
   order, most likely first), at most ``depth`` levels. A node is drafted only while its path probability
   (product of child probabilities below the match) is ``>= min_token_prob``. Score = sum of the drafted
   nodes' path probabilities (SuffixDecoding's score: the expected number of accepted tokens under the
   counts).
5. Merge: the highest-scoring draft wins, ties to the longer match, then to the earlier source of (problem,
   request, global); a source that cannot beat the best so far is skipped. ``DraftTree.score`` is the
   winner's score (``hybrid`` compares it with a threshold).

Defaults, tuned with ``python -m benchmarks.suffix_offline`` (SuffixDecoding's offline protocol on 400 real
MATH rollouts; ``benchmarks/results/suffix_offline.md``): ``alpha = 1.0, min_token_prob = 0.1`` as
ArcticInference/vLLM, ``beta = 1.0`` (a 1-token match drafts 2 tokens: cold-problem tau +4% with a 32k BPE,
reaching 1.92 at K = 16, for ~30% more drafted tokens; alpha 2, beta 2 or both add 2-4.5% more tau for
22-78% more drafted tokens, accepted/drafted falling from 0.25 to 0.22-0.15), ``min_match_len = 1``,
``max_depth = 32`` (64 changes tau by < 1%); min_token_prob 0.05-0.2 changes tau by < 0.5%. ``window_steps = 4``,
``problem_capacity = 64`` responses, ``history_capacity = 4096`` responses, ``global_capacity = 512``
responses (a GRPO rollout or two; the token count per response varies 10x), ``index_budget = 256`` suffixes
(< 1 ms of indexing per ``propose``: ``python -m benchmarks.suffix_sibling_stall``).

Cost and memory (``python -m benchmarks.drafter_propose_cost``): ~30 us of CPU per request per ``propose``
with ~300-token contexts on a loaded 2-core EPYC (1.3x the longest-match-only drafter: the shorter
candidates and re-anchoring); ``observe`` ~4 us per token; indexing ~1-2 us per suffix. Each indexed token
costs ~1.5 trie nodes of ~150 B (Python objects, which the cyclic GC also scans; the rollout worker freezes
them out of the GC during a rollout).

``state_dict()`` is plain data (every stored response with its step and membership, oldest first, and the
running requests' tokens; it indexes the queues first); ``load_state_dict`` rebuilds the tries, so drafts
after a restart equal drafts before it.

Tests: ``python -m pytest tests/rollout_actor/test_suffix_tree.py -q``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree
from services.rollout_actor.speculative.suffix_trie import (
    SuffixTrie,
    _chain,
    _longest,
    _Node,
    _OnlineTrie,
    _shorter,
    _tree,
)

__all__ = ["SuffixTreeDrafter", "SuffixTrie"]

_STATE_FORMAT = 1
# the constructor's arguments, in ``state_dict()["config"]``
_CONFIG_KEYS = (
    "max_depth window_steps global_capacity alpha beta min_match_len min_token_prob problem_capacity "
    "history_capacity use_request index_budget"
).split()
_UNKNOWN = 1 << 30  # "no upper bound known" for a match length
_MAX_REQUESTS = 1 << 16  # running-request states kept (oldest dropped beyond; the engine finishes requests)


class _Request:
    __slots__ = ("problem_id", "num_prompt", "trie", "context", "hints")

    def __init__(self, problem_id: str, num_prompt: int, depth: int, context: list[int] | None = None):
        self.problem_id = problem_id
        self.num_prompt = num_prompt
        self.trie = _OnlineTrie(depth)  # empty until the first ``propose`` builds it (``_sync``)
        # the tokens known before the trie is built (the prompt): what ``finish_request`` and ``state_dict``
        # read while ``trie.seq`` is empty
        self.context: list[int] = context if context is not None else []
        # per history source (problem, -, global): [trie version, match upper bound, context length]
        self.hints: list[list] = [[0, _UNKNOWN, 0], None, [0, _UNKNOWN, 0]]


class _Problem:
    __slots__ = ("trie", "records")

    def __init__(self, depth: int):
        self.trie = SuffixTrie(depth)
        self.records: deque[tuple[int, int, list[int]]] = deque()  # (record id, step, seq), oldest first


class SuffixTreeDrafter(Drafter):
    """Suffix-tree drafter over request / problem / global history (see the module docstring).

    Args:
        max_depth: D, the trie depth (tokens); matches are < D (a chain re-anchors past D).
        window_steps: W, a problem keeps the responses of its last W visits (RL steps that added one; >= 1).
        global_capacity: responses kept in the global trie (FIFO; 0 disables it).
        alpha, beta: draft size ``min(budget, floor(alpha * match_len + beta))``.
        min_match_len: shortest usable match (tokens, >= 1).
        min_token_prob: a node is drafted only while its path probability is >= this.
        problem_capacity: most responses kept per problem (FIFO; 0 disables the problem source).
        history_capacity: most responses kept over all problems (>= 1; the problem visited longest ago goes).
        use_request: draft from the request's own prompt + output.
        index_budget: most suffixes of queued sibling responses one ``propose`` call indexes (>= 1).

    Raises:
        ValueError: on an out-of-range argument.
    """

    name = "suffix"

    def __init__(
        self,
        max_depth: int = 32,
        window_steps: int = 4,
        global_capacity: int = 512,
        alpha: float = 1.0,
        beta: float = 1.0,
        min_match_len: int = 1,
        min_token_prob: float = 0.1,
        problem_capacity: int = 64,
        history_capacity: int = 4096,
        use_request: bool = True,
        index_budget: int = 256,
    ):
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        if not 1 <= min_match_len < max_depth:
            raise ValueError("min_match_len must be in [1, max_depth)")
        if alpha < 0:
            raise ValueError("alpha must be >= 0")
        if index_budget < 1 or history_capacity < 1:
            raise ValueError("index_budget and history_capacity must be >= 1")
        self.max_depth = int(max_depth)
        self.window_steps = int(window_steps)
        self.global_capacity = int(global_capacity)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.min_match_len = int(min_match_len)
        self.min_token_prob = float(min_token_prob)
        self.problem_capacity = int(problem_capacity)
        self.history_capacity = int(history_capacity)
        self._history_size = 0  # responses in the problem tries
        self.use_request = bool(use_request)
        self.index_budget = int(index_budget)
        self.last_index_work = 0  # suffixes of queued siblings the last ``propose`` indexed
        self._step = 0
        self._next_id = 0
        self._requests: dict[str, _Request] = {}
        self._problems: dict[str, _Problem] = {}
        self._global = SuffixTrie(self.max_depth)
        self._global_records: deque[tuple[int, str, int, list[int]]] = deque()  # (id, problem, step, seq)
        # finished responses not indexed yet (``finish_request`` only queues them): per problem, indexed a
        # bounded number of suffixes per ``propose`` of its requests, [id, step, seq, suffixes indexed]; all of
        # them (problem and global tries) by ``flush``
        self._pending_problem: dict[str, deque[list]] = {}
        self._pending_global: list[tuple[int, str, int, list[int]]] = []  # (id, problem, step, seq)
        # floor(alpha * L + beta) for L in 0..D (0 below min_match_len; nondecreasing), and the tree match cap
        # per budget 0..D (a budget > D behaves as D)
        self._sizes = [self.draft_size(L, 1 << 30) for L in range(self.max_depth + 1)]
        self._caps = [self._cap_for(b) for b in range(self.max_depth + 1)]

    # ------------------------------------------------------------------ sizing rule
    def draft_size(self, match_len: int, budget: int) -> int:
        """Draft nodes allowed after a match of ``match_len`` tokens: ``min(budget, floor(a * L + b))``."""
        if match_len < self.min_match_len:
            return 0
        return max(0, min(budget, math.floor(self.alpha * match_len + self.beta + 1e-9)))

    def _cap_for(self, budget: int) -> int:
        """Longest useful match for a tree of a budget: maximizes the room-limited size, then the match."""
        d = self.max_depth
        best_l, best_k = self.min_match_len, -1
        for L in range(self.min_match_len, d):
            k = min(self.draft_size(L, budget), d - L)
            if k >= best_k:
                best_l, best_k = L, k
            if k < best_k:
                break
        return best_l

    # ------------------------------------------------------------------ lifecycle hooks
    def start_request(self, request_id: str, problem_id: str, prompt_ids: list[int]) -> None:
        """Keeps the prompt; the request's trie is built at its first ``propose`` (module docstring)."""
        self._put_request(request_id, _Request(problem_id, len(prompt_ids), self.max_depth, list(prompt_ids)))

    def _put_request(self, request_id: str, r: _Request) -> None:
        self._requests.pop(request_id, None)
        self._requests[request_id] = r
        while len(self._requests) > _MAX_REQUESTS:
            del self._requests[next(iter(self._requests))]

    def observe(self, request_id: str, accepted_ids: list[int]) -> None:
        r = self._requests.get(request_id)
        # an empty ``trie.seq``: not built yet, ``propose`` builds it from scratch
        if r is None or not accepted_ids or not r.trie.seq:
            return
        if self.use_request:
            r.trie.extend(list(accepted_ids))
        else:
            r.trie.seq.extend(accepted_ids)

    def finish_request(self, request_id: str, problem_id: str, output_ids: list[int]) -> None:
        """Queues the response (prompt tail + ``output_ids``) for the problem and global sources; an empty
        ``output_ids`` only drops the request."""
        r = self._requests.pop(request_id, None)
        tail: list[int] = []
        if r is not None:
            p = r.num_prompt
            tail = (r.trie.seq or r.context)[max(0, p - (self.max_depth - 1)) : p]
        if output_ids:
            self._queue(problem_id, tail + [int(t) for t in output_ids], True, True)

    def add_history(
        self,
        problem_id: str,
        prompt_ids: list[int],
        output_ids: list[int],
        to_problem: bool = True,
        to_global: bool = True,
    ) -> None:
        """Queue a finished response with no running request (as ``finish_request`` would store it), for the
        problem source (``to_problem``), the global source (``to_global``) or both. Indexed like
        ``finish_request``'s: the problem's at its requests' ``propose`` (bounded) or ``flush``, the global at
        ``flush``. An empty ``output_ids`` is ignored."""
        if output_ids:
            tail = [int(t) for t in prompt_ids[max(0, len(prompt_ids) - (self.max_depth - 1)) :]]
            self._queue(problem_id, tail + [int(t) for t in output_ids], to_problem, to_global)

    def _queue(self, problem_id: str, seq: list[int], to_problem: bool, to_global: bool) -> None:
        rid = self._next_id
        self._next_id += 1
        if to_problem and self.problem_capacity > 0:
            self._pending_problem.setdefault(problem_id, deque()).append([rid, self._step, seq, 0])
        if to_global and self.global_capacity > 0:
            self._pending_global.append((rid, problem_id, self._step, seq))

    def _index_pending(self, problem_id: str, limit: int | None) -> int:
        """Index up to ``limit`` suffixes (None: all) of the problem's queued responses, oldest first; a
        response becomes a record (and the capacities are enforced) once whole. Returns the suffixes indexed."""
        q = self._pending_problem.get(problem_id)
        if not q:
            self._pending_problem.pop(problem_id, None)
            return 0
        prob = self._problems.get(problem_id)
        if prob is None:
            prob = self._problems[problem_id] = _Problem(self.max_depth)
        work = 0
        while q and (limit is None or work < limit):
            ent = q[0]
            seq, done = ent[2], ent[3]
            stop = len(seq) if limit is None else min(len(seq), done + limit - work)
            prob.trie.insert(seq, done, stop)
            work += stop - done
            ent[3] = stop
            if stop == len(seq):
                q.popleft()
                self._keep(prob, ent[0], ent[1], seq)
        if not q:
            del self._pending_problem[problem_id]
        self._evict()
        return work

    def flush(self) -> None:
        """Index every queued finished response into the problem and global tries (the engine's decode thread
        only queues them in ``finish_request``; the rollout worker calls this after a rollout, off the critical
        path). ``new_step``, ``state_dict`` and ``stats`` flush first."""
        for pid in list(self._pending_problem):
            self._index_pending(pid, None)
        pending, self._pending_global = self._pending_global, []
        for rid, pid, step, seq in pending:
            self._add_response(pid, step, seq, rid, to_problem=False)

    def new_step(self, step: int) -> None:
        """A new RL step: the responses finished from now on are stamped ``step`` (a problem's visit)."""
        self.flush()
        self._step = int(step)

    def _keep(self, prob: _Problem, rid: int, step: int, seq: list[int]) -> None:
        """Record a response indexed into ``prob``'s trie; enforce the problem's window and capacity."""
        prob.records.append((rid, step, seq))
        self._history_size += 1
        recs = prob.records
        while len(recs) > self.problem_capacity or len({r[1] for r in recs}) > self.window_steps:
            prob.trie.remove(recs.popleft()[2])
            self._history_size -= 1

    def _evict(self) -> None:
        """Drop whole problems, the one whose newest response is the oldest first, while the problem source
        holds more than ``history_capacity`` responses."""
        while self._history_size > self.history_capacity:
            old = min(
                (p for p, v in self._problems.items() if v.records),
                key=lambda p: self._problems[p].records[-1][0],
            )
            self._history_size -= len(self._problems.pop(old).records)
            for ent in self._pending_problem.get(old, ()):
                ent[3] = 0  # a response it was indexing starts over in the problem's next trie

    def _add_response(
        self,
        problem_id: str,
        step: int,
        seq: list[int],
        rid: int | None = None,
        to_problem: bool = True,
        to_global: bool = True,
    ) -> None:
        """Index a whole response at once (``flush``, ``load_state_dict``), enforcing the capacities."""
        if rid is None:
            rid = self._next_id
        self._next_id = max(self._next_id, rid + 1)
        if to_problem and self.problem_capacity > 0:
            prob = self._problems.get(problem_id)
            if prob is None:
                prob = self._problems[problem_id] = _Problem(self.max_depth)
            prob.trie.insert(seq)
            self._keep(prob, rid, step, seq)
        if to_global and self.global_capacity > 0:
            self._global.insert(seq)
            self._global_records.append((rid, problem_id, step, seq))
            while len(self._global_records) > self.global_capacity:
                self._global.remove(self._global_records.popleft()[3])

    # ------------------------------------------------------------------ propose
    def _sync(self, req: DraftRequest) -> _Request:
        """The request's state, caught up with ``req.token_ids`` (created or rebuilt when needed)."""
        r = self._requests.get(req.request_id)
        ids = list(req.token_ids)
        if r is None or len(r.trie.seq) > len(ids):
            r = _Request(req.problem_id, req.num_prompt_tokens, self.max_depth)
            self._put_request(req.request_id, r)
        have = len(r.trie.seq)
        if have < len(ids):
            if self.use_request:
                r.trie.extend(list(ids[have:]))
            else:
                r.trie.seq.extend(ids[have:])
            r.context = []  # the trie holds it now
        return r

    def propose(
        self, requests: list[DraftRequest], max_tokens: list[int], width: int = 1, depth: int = 0
    ) -> list[DraftTree]:
        """One deterministic draft per request (``probs = None``), ``len <= max_tokens[i]``.

        ``width`` >= 1 children per node (1 = chain), ``depth`` levels (0 = unlimited); ``score`` is the
        sum of the drafted nodes' path probabilities (expected accepted tokens under the counts). First indexes
        at most ``index_budget`` suffixes of the requests' problems' queued sibling responses.
        """
        out: list[DraftTree] = []
        width = max(1, int(width))
        d_max = self.max_depth
        lo = self.min_match_len
        min_p = self.min_token_prob
        use_request = self.use_request
        sizes = self._sizes
        index_left = self.index_budget
        for req, budget in zip(requests, max_tokens):  # siblings finished since: a bounded share of them
            if budget > 0 and index_left > 0 and req.problem_id in self._pending_problem:
                index_left -= self._index_pending(req.problem_id, index_left)
        self.last_index_work = self.index_budget - index_left
        glob = self._global if self._global.num_seqs else None
        for req, budget in zip(requests, max_tokens):
            if budget <= 0:
                out.append(DraftTree())
                continue
            ctx = req.token_ids
            if ctx.__class__ is not list:  # slices are compared with lists
                ctx = list(ctx)
            n = len(ctx)
            r = self._requests.get(req.request_id)
            if r is None or len(r.trie.seq) != n:
                r = self._sync(req)
            levels = depth if depth > 0 else budget
            size_budget = min(budget, levels) if width == 1 else budget
            # chains re-anchor at the trie's depth: any match fits; a tree needs room below its match
            cap = d_max - 1 if width == 1 else self._caps[min(d_max, size_budget, levels)]
            if cap > n:
                cap = n
            kmax = min(size_budget, sizes[cap])
            best: list[int] | DraftTree | None = None
            best_score = 0.0
            if kmax < 1:
                out.append(DraftTree())
                continue
            prob = self._problems.get(req.problem_id)
            for si, trie in enumerate(
                (prob.trie if prob is not None else None, r.trie if use_request else None, glob)
            ):
                if trie is None or best_score >= kmax:
                    continue
                # only a match with draft_size(L) > best_score can win
                need = lo if best is None else self._min_match_beating(best_score)
                act = None
                if si == 1:
                    # the request's own trie: its active starts are exactly the suffixes that occurred earlier
                    # (shorter than D), oldest first, so the longest match needs no search
                    act = trie.active
                    if not act:
                        continue
                    L = min(n - next(iter(act)), cap)
                    node = act.get(n - L) if L >= need else None
                    if node is None or node.tot <= 0:
                        continue
                    pos = (node, node.lim if node.lim < len(node.seq) else len(node.seq))
                else:
                    L, pos = self._match(trie, r.hints[si], ctx, n, need, cap)
                    if pos is None:
                        continue
                # candidates: the longest match, then each shorter length where the matched count grows
                while True:
                    k = min(size_budget, sizes[L])
                    if k <= best_score:
                        break
                    node, q = pos
                    if width == 1:
                        toks, score = _chain(trie.root, node, q, k, min_p, L, d_max, ctx, lo)
                        if score > best_score:
                            best, best_score = toks, score
                    else:
                        tree = _tree(node, q, k, width, levels, min_p)
                        if tree.score > best_score:
                            best, best_score = tree, tree.score
                    if best_score >= kmax:  # no draft can score more
                        break
                    need = self._min_match_beating(best_score) if best is not None else lo
                    if L - 1 < need:
                        break
                    L, pos = _shorter(trie.root, act, ctx, n, need, L, node.n)
                    if pos is None:
                        break
            if best is None:
                out.append(DraftTree())
            elif width == 1:
                out.append(DraftTree.chain(best, None, best_score))
            else:
                out.append(best)
        return out

    def _match(
        self, trie: SuffixTrie, hint: list, ctx: list[int], n: int, need: int, cap: int
    ) -> tuple[int, tuple[_Node, int] | None]:
        """Longest match ``L`` in ``[need, cap]`` in a history trie (``(0, None)`` if none), using and updating
        the request's hint for that trie.

        ``hint = [trie version, upper bound U of the longest match, context length]`` after the last search.
        Appending dn tokens to the context grows the longest match by at most dn, so ``U + dn`` bounds it,
        unless the trie gained a sequence since that holds a longer match (checked against the trie's
        insertion log); removals only shorten matches."""
        hi, bounded = cap, False
        if hint[2] <= n:
            g = hint[1] + n - hint[2]
            if g <= cap and (hint[0] == trie.version or not trie.grown_since(hint[0], ctx, n, g)):
                hi, bounded = g, True
        if hi < need:
            if bounded:
                hint[0], hint[1], hint[2] = trie.version, hi, n
            return 0, None
        # a miss is likely when the last search found nothing, or when only a long match would beat the best
        # draft so far: then the shortest candidate goes first
        lo = self.min_match_len
        L, pos = _longest(trie.root, ctx, n, need, hi, need > lo or (bounded and hint[1] < lo))
        if pos is None:
            ub = need - 1
        elif L < hi or bounded:
            ub = L
        else:
            ub = _UNKNOWN
        hint[0], hint[1], hint[2] = trie.version, ub, n
        return L, pos

    def _min_match_beating(self, score: float) -> int:
        """Smallest match length ``L >= min_match_len`` whose draft size can exceed ``score`` (> D: none)."""
        return bisect.bisect_left(self._sizes, math.floor(score) + 1, self.min_match_len)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Plain, picklable: config, step, every stored response (oldest first), running requests."""
        self.flush()
        records: dict[int, list] = {}
        for pid, prob in self._problems.items():
            for rid, step, seq in prob.records:
                records[rid] = [rid, pid, step, list(seq), True, False]
        for rid, pid, step, seq in self._global_records:
            if rid in records:
                records[rid][5] = True
            else:
                records[rid] = [rid, pid, step, list(seq), False, True]
        return {
            "format": _STATE_FORMAT,
            "config": {k: getattr(self, k) for k in _CONFIG_KEYS},
            "step": self._step,
            "next_id": self._next_id,
            "responses": [tuple(records[k]) for k in sorted(records)],
            "requests": {
                rid: (r.problem_id, r.num_prompt, list(r.trie.seq or r.context))
                for rid, r in self._requests.items()
            },
        }

    def load_state_dict(self, state: dict) -> None:
        """Rebuild from ``state_dict()`` (this instance's config applies; capacities are re-enforced)."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"unknown suffix drafter state format {state.get('format')!r}")
        self._step = int(state["step"])
        self._next_id = 0
        self._requests = {}
        self._problems = {}
        self._history_size = 0
        self._global = SuffixTrie(self.max_depth)
        self._global_records = deque()
        self._pending_problem = {}
        self._pending_global = []
        for rid, pid, step, seq, in_problem, in_global in state["responses"]:
            seq = [int(t) for t in seq]
            self._add_response(pid, int(step), seq, int(rid), bool(in_problem), bool(in_global))
        self._next_id = max(self._next_id, int(state.get("next_id", 0)))
        self._evict()
        for rid, (pid, num_prompt, seq) in state["requests"].items():
            # built at its next ``propose``, like a started request
            self._requests[rid] = _Request(pid, int(num_prompt), self.max_depth, [int(t) for t in seq])

    # ------------------------------------------------------------------ introspection
    def stats(self) -> dict:
        """Sizes: responses and tokens per source, explicit trie nodes (O(nodes) to compute)."""
        self.flush()
        return {
            "step": self._step,
            "requests": len(self._requests),
            "problems": len(self._problems),
            "problem_responses": sum(len(p.records) for p in self._problems.values()),
            "problem_tokens": sum(p.trie.num_tokens for p in self._problems.values()),
            "problem_nodes": sum(p.trie.num_nodes() for p in self._problems.values()),
            "global_responses": len(self._global_records),
            "global_tokens": self._global.num_tokens,
            "global_nodes": self._global.num_nodes(),
        }
