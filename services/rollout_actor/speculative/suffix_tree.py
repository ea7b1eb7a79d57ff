"""Suffix-tree drafter: nonparametric drafts from the request itself, its GRPO group, and recent rollouts.

After SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975; ArcticInference / vLLM ``suffix``) and DAS
(arXiv 2511.13841). Deterministic drafter: every ``DraftTree`` it returns has ``probs = None``.

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
  thread, also in steps where speculation is off); a problem's queue is indexed when one of its requests
  proposes, so siblings see each other exactly as if indexed at once. A response stays while it is one of the last ``problem_capacity`` of its problem
  and was added in one of the last ``window_steps`` (W) RL steps: ``new_step(s)`` removes those added at
  steps ``<= s - W``.
* **global**: recent responses of all problems, FIFO-evicted (whole responses) past ``global_capacity``
  tokens. Queued responses enter it at ``flush()`` (the rollout worker calls it after each rollout, in a
  background thread; ``new_step``, ``state_dict`` and ``stats`` flush too), so within one rollout the global
  source serves the earlier rollouts' responses.

A stored response is ``prompt[-(D - 1):] + output_ids``: the prompt tail lets a sibling that has generated
nothing yet draft the group's first tokens.

Trie
----
A node's count ``n`` is the number of occurrences of its string; the probability of a child is
``count(child) / sum(count(children))`` (the parent's occurrences that continue; SuffixDecoding divides by
``count(parent)``, which differs only at sequence ends, i.e. for the growing request itself). Runs of
tokens with one count are one node (``seq[pos:lim]`` of a stored sequence, as in a compressed suffix
tree, and a leaf's run grows with a running request), so an indexed token costs about 1.5 nodes instead of
D. ``remove`` re-walks the sequence's suffixes, decrementing counts and deleting nodes that reach zero, so
eviction is exact: the counts always equal those of the sequences currently indexed (tested against brute
force).

Propose (per request; ``max_tokens[i]`` = budget b)
--------------------------------------------------
1. Match, per source: the longest suffix of the context (length ``L <= cap``) that is a trie node with a
   continuation; no draft from the source if ``L < min_match_len``. ``cap`` leaves room for the draft
   below the match in the depth-D trie: the largest ``L`` with ``L + min(b, floor(alpha * L + beta)) <= D``.
   Request source: read off the online trie for free (its active starts are exactly the suffixes that
   occurred earlier). History sources: a few root walks; each request remembers an upper bound of its
   last match per trie, valid after appending dn tokens as ``U + dn`` unless a sequence inserted since holds
   a longer match (checked with ``bytes.find`` in the trie's insertion log), so the steady state is one
   walk. These shortcuts never change a draft (tested against a freshly restored drafter).
2. Size: ``k = min(b, floor(alpha * L + beta))`` draft nodes (``depth > 0`` also caps a chain's length).
3. Draft: ``width == 1``: a chain following the most frequent child (ties: lowest token id); ``width > 1``:
   best-first tree, the frontier node of highest path probability next, each node offering its ``width``
   most frequent children (siblings in verification order, most likely first), at most ``depth`` levels.
   A node is drafted only while its path probability (product of child probabilities below the match) is
   ``>= min_token_prob``. Score = sum of the drafted nodes' path probabilities (SuffixDecoding's score: the
   expected number of accepted tokens under the counts).
4. Merge: the highest-scoring draft of the three sources wins, ties to the earlier of (problem, request,
   global); a source that cannot beat the best so far (``k <= score``) is skipped, so a perfect sibling
   match costs one source. ``DraftTree.score`` is the winner's score (``hybrid`` compares it with a
   threshold).

Defaults: ``alpha = 1.0, beta = 0.0, min_token_prob = 0.1`` as ArcticInference/vLLM; ``max_depth = 32``
(24 there) so that an 8-token draft can follow a 24-token match; ``min_match_len = 2`` (a 1-token match
drafts too much noise); ``window_steps = 4``; ``problem_capacity = 64`` responses; ``global_capacity =
65536`` tokens.

Cost and memory (``python -m benchmarks.drafter_propose_cost``, results in
``benchmarks/results/drafter_propose_cost.json``): about 20 us per request per ``propose`` with
~300-token contexts on a loaded 2-core EPYC (1.3 ms for 64 requests); ``observe`` ~4 us per token;
indexing a finished 200-token response ~1.5 ms (two insertions, plus FIFO removals; queued by
``finish_request``, done at propose / ``flush``). Each indexed
token costs ~1.5 trie nodes of ~150 B (Python objects, which the cyclic GC also scans).

``state_dict()`` is plain data (every stored response with its step and membership, oldest first, and the
running requests' tokens); ``load_state_dict`` rebuilds the tries, so drafts after a restart equal drafts
before it.

Tests: ``python -m pytest tests/rollout_actor/test_suffix_tree.py -q``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from array import array
from collections import deque

from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree

__all__ = ["SuffixTreeDrafter", "SuffixTrie"]

_STATE_FORMAT = 1
_UNKNOWN = 1 << 30  # "no upper bound known" for a match length
_VERSIONS = itertools.count(1)  # trie versions are unique across tries (match hints compare them)
_LOG = 64  # insertions a trie remembers for match hints
_ITEM = array("i").itemsize
_MAX_REQUESTS = 1 << 16  # running-request states kept (oldest dropped beyond; the engine finishes requests)


class _Node:
    """Trie node: reached by its key token (the parent's dict key), then a run of tokens of the same count,
    ``seq[pos:min(len(seq), lim)]`` (empty for most inner nodes; a "leaf" run may grow with a running
    request's sequence), then its children. ``n``: occurrences of every string ending in this node;
    ``tot``: the sum of the children's counts (the occurrences that continue past the run). ``bc``/``bk``: the
    cached most frequent child and its token (None: unknown)."""

    __slots__ = ("n", "tot", "ch", "seq", "pos", "lim", "bk", "bc")

    def __init__(self, n: int, seq: list[int] | None, pos: int, lim: int):
        self.n = n
        self.tot = 0
        self.ch: dict[int, _Node] | None = None
        self.seq = seq
        self.pos = pos
        self.lim = lim
        # the most frequent child (ties: lowest token) and its token; bc None = unknown (recomputed lazily)
        self.bk = 0
        self.bc: _Node | None = None


def _new_root() -> _Node:
    root = _Node(0, None, 0, 0)
    root.ch = {}
    return root


def _split(node: _Node, x: int) -> None:
    """Cut ``node``'s run after ``x`` tokens; the rest (same count) becomes its only child."""
    p, seq = node.pos, node.seq
    c = _Node(node.n, seq, p + x + 1, node.lim)
    c.tot = node.tot
    c.ch = node.ch
    c.bk, c.bc = node.bk, node.bc
    node.lim = p + x
    node.bk = seq[p + x]
    node.ch = {node.bk: c}
    node.bc = c
    node.tot = node.n


def _best(node: _Node) -> _Node:
    """The most frequent child of ``node`` (which has children); ties: lowest token. Cached in the node."""
    tok, c, bn = 0, None, 0
    for t, x in node.ch.items():
        if x.n > bn or (x.n == bn and t < tok):
            tok, c, bn = t, x, x.n
    node.bk, node.bc = tok, c
    return c


def _common(a: list[int], i: int, b: list[int], j: int, m: int) -> int:
    """Length of the common prefix of ``a[i:i+m]`` and ``b[j:j+m]``."""
    x = 0
    while x < m and a[i + x] == b[j + x]:
        x += 1
    return x


def _child_key(item: tuple[int, _Node]) -> tuple[int, int]:
    return item[1].n, -item[0]


def _probe(root: _Node, ctx: list[int], a: int, b: int) -> tuple[_Node, int] | None:
    """Position after reading ``ctx[a:b]`` (``b > a``) if that string is in the trie AND has a continuation.

    The position is ``(node, q)``: ``q`` indexes ``node.seq``; the next token is ``node.seq[q]`` while ``q`` is
    inside the node's run, else one of the node's children."""
    node = root
    j = a
    while j < b:
        ch = node.ch
        if not ch:
            return None
        node = ch.get(ctx[j])
        if node is None:
            return None
        j += 1
        p = node.pos
        e = node.lim
        if p < e:
            seq = node.seq
            if len(seq) < e:
                e = len(seq)
                if p >= e:
                    continue
            r = b - j
            if r < e - p:
                q = p + r
                if seq[p:q] != ctx[j:b]:
                    return None
                return node, q
            if seq[p:e] != ctx[j : j + e - p]:
                return None
            j += e - p
    if node.tot > 0:
        e = node.lim
        return node, (e if e < len(node.seq) else len(node.seq))
    return None


def _longest(
    root: _Node, ctx: list[int], n: int, lo: int, hi: int, low_first: bool = False
) -> tuple[int, tuple[_Node, int] | None]:
    """Largest ``L`` in ``[lo, hi]`` whose suffix ``ctx[n-L:n]`` probes true (monotone in ``L``), with its
    position. Probes ``hi`` first (the steady state: the match continues; ``low_first``: ``lo`` first, when
    a miss is likely), then searches upward from ``lo`` (exponential, then binary): after a miss the new
    match is usually short."""
    if hi < lo:
        return 0, None
    if low_first:
        gp = _probe(root, ctx, n - lo, n)
        if gp is None or hi == lo:
            return (lo, gp) if gp is not None else (0, None)
        p = _probe(root, ctx, n - hi, n)
        if p is not None:
            return hi, p
    else:
        p = _probe(root, ctx, n - hi, n)
        if p is not None:
            return hi, p
        if hi == lo:
            return 0, None
        gp = _probe(root, ctx, n - lo, n)
        if gp is None:
            return 0, None
    good, bad = lo, hi
    step = 1
    while good + step < bad:
        t = good + step
        p = _probe(root, ctx, n - t, n)
        if p is None:
            bad = t
            break
        good, gp = t, p
        step <<= 1
    while bad - good > 1:
        mid = (good + bad) >> 1
        p = _probe(root, ctx, n - mid, n)
        if p is None:
            bad = mid
        else:
            good, gp = mid, p
    return good, gp


def _chain(node: _Node, q: int, k: int, min_p: float) -> tuple[list[int], float]:
    """Greedy chain of at most ``k`` tokens from position ``(node, q)``; returns (tokens, score)."""
    toks: list[int] = []
    score = 0.0
    p = 1.0
    while True:
        seq = node.seq
        e = node.lim
        if len(seq) < e:
            e = len(seq)
        if q < e:
            take = k - len(toks)
            if e - q < take:
                take = e - q
            toks += seq[q : q + take]
            score += p * take
            if len(toks) >= k:
                break
        ch = node.ch
        if not ch:
            break
        c = node.bc
        if c is None:
            c = _best(node)
        tok = node.bk
        p *= c.n / node.tot
        if p < min_p:
            break
        toks.append(tok)
        score += p
        if len(toks) >= k:
            break
        node = c
        q = c.pos
    return toks, score


def _children(node: _Node, q: int, p: float, width: int, min_p: float) -> list[tuple[float, int, _Node, int]]:
    """Up to ``width`` children of position ``(node, q)``: (path prob, token, node, q), most likely first."""
    seq = node.seq
    e = node.lim
    if len(seq) < e:
        e = len(seq)
    if q < e:
        return [(p, seq[q], node, q + 1)]
    ch = node.ch
    if not ch:
        return []
    items = ch.items() if len(ch) == 1 else sorted(ch.items(), key=_child_key, reverse=True)[:width]
    tot = node.tot
    out = []
    for tok, c in items:
        pc = p * c.n / tot
        if pc >= min_p:
            out.append((pc, tok, c, c.pos))
    return out


def _tree(node: _Node, q: int, k: int, width: int, levels: int, min_p: float) -> DraftTree:
    """Best-first draft tree of at most ``k`` nodes, ``width`` children per node, ``levels`` levels."""
    tokens: list[int] = []
    parents: list[int] = []
    score = 0.0
    heap: list[tuple[float, int, int, int, _Node, int, int]] = []
    order = 0
    for pc, tok, c, cq in _children(node, q, 1.0, width, min_p):
        heap.append((-pc, order, tok, -1, c, cq, 1))
        order += 1
    heapq.heapify(heap)
    while heap and len(tokens) < k:
        negp, _, tok, par, c, cq, d = heapq.heappop(heap)
        i = len(tokens)
        tokens.append(tok)
        parents.append(par)
        score -= negp
        if d < levels:
            for pc, t2, c2, q2 in _children(c, cq, -negp, width, min_p):
                heapq.heappush(heap, (-pc, order, t2, i, c2, q2, d + 1))
                order += 1
    return DraftTree(tokens, parents, None, False, score)


class SuffixTrie:
    """Counted suffix trie over a multiset of finished sequences (each suffix truncated to ``depth``), with
    single-count-runs compressed (a path shared by the same occurrences is one node).

    ``insert(seq)`` / ``remove(seq)`` cost O(len(seq) * nodes per path); ``remove`` must get a sequence equal
    to one inserted. ``version`` changes (to a value unique across tries) on every mutation.
    """

    __slots__ = ("root", "depth", "version", "created", "num_tokens", "num_seqs", "log", "log_floor")

    def __init__(self, depth: int):
        self.root = _new_root()
        self.depth = depth
        self.version = self.created = next(_VERSIONS)
        self.num_tokens = 0
        self.num_seqs = 0
        # recent insertions (version after it, the sequence packed 4 bytes per token), for match hints; the
        # version of the newest insertion that fell out of the log
        self.log: deque[tuple[int, bytes]] = deque()
        self.log_floor = 0

    def grown_since(self, version: int, ctx: list[int], n: int, g: int) -> bool:
        """False if no sequence inserted after ``version`` can contain ``ctx[n-g-1:n]`` followed by a token
        (so a bound ``g`` on the longest match, valid at ``version``, still holds: removals only shorten
        matches). True when it may, or when the log does not reach back to ``version``."""
        if version < self.created or self.log_floor > version:
            return True
        if g >= n:
            return False
        pat = None
        for v, packed in reversed(self.log):
            if v <= version:
                break
            if pat is None:
                try:
                    pat = array("i", ctx[n - g - 1 : n]).tobytes()
                except OverflowError:
                    return True
            if packed.find(pat, 0, len(packed) - _ITEM) >= 0:
                return True
        return False

    def insert(self, s: list[int]) -> None:
        """Add every suffix of ``s`` (the trie keeps a reference to ``s``: do not mutate it later)."""
        root, depth = self.root, self.depth
        m = len(s)
        for i in range(m):
            e = min(m, i + depth)
            node = root
            j = i
            while j < e:
                tok = s[j]
                ch = node.ch
                if ch is None:
                    ch = node.ch = {}
                child = ch.get(tok)
                node.tot += 1
                j += 1
                if child is None:
                    ch[tok] = child = _Node(1, s, j, i + depth)
                    if node.tot == 1:  # the only child
                        node.bk, node.bc = tok, child
                    elif node.bc is not None and node.bc.n == 1 and tok < node.bk:
                        node.bk, node.bc = tok, child
                    break
                cs, p = child.seq, child.pos
                ce = child.lim
                if len(cs) < ce:
                    ce = len(cs)
                if p < ce:
                    x = ce - p
                    if e - j < x:
                        x = e - j
                    if cs[p : p + x] != s[j : j + x]:
                        x = _common(cs, p, s, j, x)
                    if x < ce - p:
                        _split(child, x)
                    j += x
                child.n += 1
                b = node.bc
                if b is not None and b is not child and (child.n > b.n or (child.n == b.n and tok < node.bk)):
                    node.bk, node.bc = tok, child
                node = child
        self.version = next(_VERSIONS)
        self.num_tokens += m
        self.num_seqs += 1
        log = self.log
        try:
            log.append((self.version, array("i", s).tobytes()))
        except OverflowError:  # ids beyond int32: no log entry, so hints older than this are not trusted
            self.log_floor = self.version
        if len(log) > _LOG:
            self.log_floor = max(self.log_floor, log.popleft()[0])

    def remove(self, s: list[int]) -> None:
        """Remove one occurrence of every suffix of ``s`` (exact inverse of ``insert``)."""
        root, depth = self.root, self.depth
        m = len(s)
        for i in range(m):
            e = min(m, i + depth)
            node = root
            j = i
            while j < e:
                tok = s[j]
                child = node.ch[tok]
                node.tot -= 1
                child.n -= 1
                if node.bc is child:
                    node.bc = None
                if child.n == 0:
                    del node.ch[tok]
                    break
                ce = child.lim
                if len(child.seq) < ce:
                    ce = len(child.seq)
                j += 1 + ce - child.pos
                node = child
        self.version = next(_VERSIONS)
        self.num_tokens -= m
        self.num_seqs -= 1

    def count(self, tokens: list[int]) -> int:
        """Occurrences of ``tokens`` (``len <= depth``) in the indexed sequences."""
        node, j, b = self.root, 0, len(tokens)
        if not b:
            return node.tot
        while j < b:
            node = (node.ch or {}).get(tokens[j])
            if node is None:
                return 0
            j += 1
            e = min(node.lim, len(node.seq))
            r = min(e - node.pos, b - j)
            if node.seq[node.pos : node.pos + r] != tokens[j : j + r]:
                return 0
            j += r
        return node.n

    def num_nodes(self) -> int:
        """Nodes, root included (memory accounting; O(nodes))."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += 1
            if node.ch:
                stack.extend(node.ch.values())
        return total


class _OnlineTrie(SuffixTrie):
    """Suffix trie over ONE growing sequence (``seq``), extended token by token."""

    __slots__ = ("seq", "active")

    def __init__(self, depth: int):
        super().__init__(depth)
        self.seq: list[int] = []
        # start -> node whose run ends exactly at the end of seq[start:], for every start whose path is not
        # the growing run of a leaf it owns (a leaf created for start k has lim = k + depth)
        self.active: dict[int, _Node] = {}

    def extend(self, tokens: list[int]) -> None:
        s, depth, active, root = self.seq, self.depth, self.active, self.root
        for tok in tokens:
            n = len(s)
            s.append(tok)
            active[n] = root
            for i, node in list(active.items()):
                ch = node.ch
                if ch is None:
                    ch = node.ch = {}
                child = ch.get(tok)
                node.tot += 1
                if child is None:
                    ch[tok] = child = _Node(1, s, n + 1, i + depth)
                    if node.tot == 1:
                        node.bk, node.bc = tok, child
                    elif node.bc is not None and node.bc.n == 1 and tok < node.bk:
                        node.bk, node.bc = tok, child
                    del active[i]
                    continue
                # this occurrence ends right after child's key: cut child's run there (an earlier start's
                # leaf run stays with the remainder and keeps growing)
                p, ce = child.pos, child.lim
                if n + 1 < ce:
                    ce = n + 1
                if p < ce:
                    _split(child, 0)
                child.n += 1
                b = node.bc
                if b is not None and b is not child and (child.n > b.n or (child.n == b.n and tok < node.bk)):
                    node.bk, node.bc = tok, child
                if n + 1 - i < depth:
                    active[i] = child
                else:
                    del active[i]
        self.num_tokens = len(s)
        self.version = next(_VERSIONS)


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
        max_depth: D, the trie depth (tokens); matches are < D and match + draft <= D.
        window_steps: W, a problem keeps the responses of its last W RL steps (>= 1).
        global_capacity: tokens kept in the global trie (FIFO over whole responses; 0 disables it).
        alpha, beta: draft size ``min(budget, floor(alpha * match_len + beta))``.
        min_match_len: shortest usable match (tokens).
        min_token_prob: a node is drafted only while its path probability is >= this.
        problem_capacity: most responses kept per problem (FIFO; 0 disables the problem source).
        use_request: draft from the request's own prompt + output.
    """

    name = "suffix"

    def __init__(
        self,
        max_depth: int = 32,
        window_steps: int = 4,
        global_capacity: int = 65536,
        alpha: float = 1.0,
        beta: float = 0.0,
        min_match_len: int = 2,
        min_token_prob: float = 0.1,
        problem_capacity: int = 64,
        use_request: bool = True,
    ):
        if max_depth < 2:
            raise ValueError("max_depth must be >= 2")
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        if not 1 <= min_match_len < max_depth:
            raise ValueError("min_match_len must be in [1, max_depth)")
        if alpha < 0:
            raise ValueError("alpha must be >= 0")
        self.max_depth = int(max_depth)
        self.window_steps = int(window_steps)
        self.global_capacity = int(global_capacity)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.min_match_len = int(min_match_len)
        self.min_token_prob = float(min_token_prob)
        self.problem_capacity = int(problem_capacity)
        self.use_request = bool(use_request)
        self._step = 0
        self._next_id = 0
        self._requests: dict[str, _Request] = {}
        self._problems: dict[str, _Problem] = {}
        self._global = SuffixTrie(self.max_depth)
        self._global_records: deque[tuple[int, str, int, list[int]]] = deque()  # (id, problem, step, seq)
        # finished responses not indexed yet (``finish_request`` only queues them): per problem, indexed when a
        # request of that problem proposes; all of them (problem and global tries) by ``flush``
        self._pending_problem: dict[str, list[tuple[int, int, list[int]]]] = {}  # problem -> (id, step, seq)
        self._pending_global: list[tuple[int, str, int, list[int]]] = []  # (id, problem, step, seq)
        # floor(alpha * L + beta) for L in 0..D (0 below min_match_len; nondecreasing), and the match cap per
        # budget 0..D (a budget > D behaves as D)
        self._sizes = [self.draft_size(L, 1 << 30) for L in range(self.max_depth + 1)]
        self._caps = [self._cap_for(b) for b in range(self.max_depth + 1)]

    # ------------------------------------------------------------------ sizing rule
    def draft_size(self, match_len: int, budget: int) -> int:
        """Draft nodes allowed after a match of ``match_len`` tokens: ``min(budget, floor(a * L + b))``."""
        if match_len < self.min_match_len:
            return 0
        return max(0, min(budget, math.floor(self.alpha * match_len + self.beta + 1e-9)))

    def _cap_for(self, budget: int) -> int:
        """Longest useful match for a budget: maximizes the room-limited draft size, then the match."""
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
        r = self._requests.pop(request_id, None)
        tail: list[int] = []
        if r is not None:
            p = r.num_prompt
            tail = (r.trie.seq or r.context)[max(0, p - (self.max_depth - 1)) : p]
        seq = tail + [int(t) for t in output_ids]
        if output_ids:
            rid = self._next_id
            self._next_id += 1
            if self.problem_capacity > 0:
                self._pending_problem.setdefault(problem_id, []).append((rid, self._step, seq))
            if self.global_capacity > 0:
                self._pending_global.append((rid, problem_id, self._step, seq))

    def _flush_problem(self, problem_id: str) -> None:
        for rid, step, seq in self._pending_problem.pop(problem_id, ()):
            self._add_response(problem_id, step, seq, rid, to_global=False)

    def flush(self) -> None:
        """Index every queued finished response into the problem and global tries (the engine's decode thread
        only queues them in ``finish_request``; the rollout worker calls this after a rollout, off the critical
        path). ``new_step``, ``state_dict`` and ``stats`` flush first."""
        for pid in list(self._pending_problem):
            self._flush_problem(pid)
        pending, self._pending_global = self._pending_global, []
        for rid, pid, step, seq in pending:
            self._add_response(pid, step, seq, rid, to_problem=False)

    def new_step(self, step: int) -> None:
        self.flush()
        self._step = int(step)
        horizon = self._step - self.window_steps
        for pid in list(self._problems):
            prob = self._problems[pid]
            while prob.records and prob.records[0][1] <= horizon:
                _, _, seq = prob.records.popleft()
                prob.trie.remove(seq)
            if not prob.records:
                del self._problems[pid]

    def _add_response(
        self,
        problem_id: str,
        step: int,
        seq: list[int],
        rid: int | None = None,
        to_problem: bool = True,
        to_global: bool = True,
    ) -> None:
        if rid is None:
            rid = self._next_id
        self._next_id = max(self._next_id, rid + 1)
        if to_problem and self.problem_capacity > 0:
            prob = self._problems.get(problem_id)
            if prob is None:
                prob = self._problems[problem_id] = _Problem(self.max_depth)
            prob.trie.insert(seq)
            prob.records.append((rid, step, seq))
            while len(prob.records) > self.problem_capacity:
                prob.trie.remove(prob.records.popleft()[2])
        if to_global and self.global_capacity > 0:
            self._global.insert(seq)
            self._global_records.append((rid, problem_id, step, seq))
            while self._global.num_tokens > self.global_capacity and self._global_records:
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
        sum of the drafted nodes' path probabilities.
        """
        out: list[DraftTree] = []
        width = max(1, int(width))
        d_max = self.max_depth
        lo = self.min_match_len
        min_p = self.min_token_prob
        glob = self._global if self._global.num_seqs else None
        use_request = self.use_request
        sizes = self._sizes
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
            cap = self._caps[min(d_max, size_budget, levels)]
            if cap > n:
                cap = n
            kmax = min(size_budget, sizes[cap])
            best: list[int] | DraftTree | None = None
            best_score = 0.0
            if kmax >= 1:
                if req.problem_id in self._pending_problem:  # siblings finished since: index them now
                    self._flush_problem(req.problem_id)
                prob = self._problems.get(req.problem_id)
                for si, trie in enumerate(
                    (prob.trie if prob is not None else None, r.trie if use_request else None, glob)
                ):
                    if trie is None or best_score >= kmax:
                        continue
                    # only a match with draft_size(L) > best_score can win
                    need = lo if best is None else self._min_match_beating(best_score)
                    if si == 1:
                        # the request's own trie: its active starts are exactly the suffixes that occurred
                        # earlier (shorter than D), oldest first, so the longest match needs no search
                        act = trie.active
                        if not act:
                            continue
                        L = n - next(iter(act))
                        if L > cap:
                            L = cap
                        if L < need:
                            continue
                        node = act.get(n - L)
                        if node is None or node.tot <= 0:
                            continue
                        pos = (node, node.lim if node.lim < len(node.seq) else len(node.seq))
                    else:
                        L, pos = self._match(trie, r.hints[si], ctx, n, need, cap)
                        if pos is None:
                            continue
                    k = min(size_budget, sizes[L])
                    node, q = pos
                    if width == 1:
                        toks, score = _chain(node, q, k, min_p)
                        if score > best_score:
                            best, best_score = toks, score
                    else:
                        tree = _tree(node, q, k, width, levels, min_p)
                        if tree.score > best_score:
                            best, best_score = tree, tree.score
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
            "config": {
                "max_depth": self.max_depth,
                "window_steps": self.window_steps,
                "global_capacity": self.global_capacity,
                "alpha": self.alpha,
                "beta": self.beta,
                "min_match_len": self.min_match_len,
                "min_token_prob": self.min_token_prob,
                "problem_capacity": self.problem_capacity,
                "use_request": self.use_request,
            },
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
        self._global = SuffixTrie(self.max_depth)
        self._global_records = deque()
        self._pending_problem = {}
        self._pending_global = []
        for rid, pid, step, seq, in_problem, in_global in state["responses"]:
            seq = [int(t) for t in seq]
            self._add_response(pid, int(step), seq, int(rid), bool(in_problem), bool(in_global))
        self._next_id = max(self._next_id, int(state.get("next_id", 0)))
        self.new_step(self._step)
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
