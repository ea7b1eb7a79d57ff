"""Counted suffix tries for the suffix drafter (``suffix_tree.SuffixTreeDrafter``), and the draft walks over them.

After SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975). A trie holds every suffix of every indexed
sequence, truncated to ``depth`` tokens; a node's count ``n`` is the number of occurrences of its string; the
probability of a child is ``count(child) / sum(count(children))``. Runs of tokens with one count are one node
(``seq[pos:lim]`` of a stored sequence, as in a compressed suffix tree), so an indexed token costs about 1.5
nodes instead of ``depth``. ``SuffixTrie.insert`` / ``remove`` take a range of suffix starts, so a long
sequence can be indexed a bounded number of suffixes at a time; ``remove`` is the exact inverse of ``insert``
(tested against brute force).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections import deque

from services.rollout_actor.speculative.base import DraftTree

__all__ = ["SuffixTrie"]

_VERSIONS = itertools.count(1)  # trie versions are unique across tries (match hints compare them)
_LOG = 64  # insertions a trie remembers for match hints
_ITEM = array("i").itemsize


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


def _shorter(
    root: _Node, active: dict[int, _Node] | None, ctx: list[int], n: int, lo: int, L: int, c: int
) -> tuple[int, tuple[_Node, int] | None]:
    """Longest ``L' in [lo, L)`` whose suffix ``ctx[n-L':n]`` occurs more than ``c`` times (with a
    continuation), and its position; ``(0, None)`` if none. Counts only grow as the suffix shortens, so a
    binary search works. ``active``: an online trie's active starts (every shorter suffix is one), else None
    (root walks)."""
    if active is not None:
        for x in range(L - 1, lo - 1, -1):
            node = active.get(n - x)
            if node is None:
                break
            if node.n > c:
                if node.tot <= 0:
                    break
                return x, (node, node.lim if node.lim < len(node.seq) else len(node.seq))
        return 0, None
    if L - 1 < lo:
        return 0, None
    p = _probe(root, ctx, n - (L - 1), n)
    if p is not None and p[0].n > c:
        return L - 1, p
    if L - 2 < lo:
        return 0, None
    gp = _probe(root, ctx, n - lo, n)
    if gp is None or gp[0].n <= c:
        return 0, None
    good, bad = lo, L - 1
    while bad - good > 1:
        mid = (good + bad) >> 1
        p = _probe(root, ctx, n - mid, n)
        if p is not None and p[0].n > c:
            good, gp = mid, p
        else:
            bad = mid
    return good, gp


def _chain(
    root: _Node, node: _Node, q: int, k: int, min_p: float, d: int, depth: int, ctx: list[int], lo: int
) -> tuple[list[int], float]:
    """Greedy chain of at most ``k`` tokens from position ``(node, q)`` at trie depth ``d`` (the match length);
    returns (tokens, score = sum of path probabilities).

    At the trie's depth limit (a path cut at ``depth`` tokens, not a sequence end) the chain re-anchors: the
    longest suffix (``lo`` to ``depth // 2`` tokens) of ``ctx`` + the tokens drafted so far that the trie
    continues, and goes on from there (path probabilities keep multiplying), so a chain budget up to ``depth``
    and beyond is usable."""
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
            d += take
            score += p * take
            if len(toks) >= k:
                break
        ch = node.ch
        if not ch:
            if d < depth:  # the occurrences end here
                break
            r = depth // 2
            w = (ctx[max(0, len(ctx) - r) :] + toks)[-r:] if len(toks) < r else toks[-r:]
            d, pos = _longest(root, w, len(w), lo, min(r, len(w)), True)
            if pos is None:
                break
            node, q = pos
            continue
        c = node.bc
        if c is None:
            c = _best(node)
        tok = node.bk
        p *= c.n / node.tot
        if p < min_p:
            break
        toks.append(tok)
        d += 1
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

    def insert(self, s: list[int], start: int = 0, stop: int | None = None) -> None:
        """Add the suffixes of ``s`` starting at ``start <= i < stop`` (default: all of them; the trie keeps a
        reference to ``s``: do not mutate it later). Indexing a sequence in several calls over consecutive
        ranges equals one call; ``num_seqs`` counts a sequence when its last suffix is in."""
        root, depth = self.root, self.depth
        m = len(s)
        stop = m if stop is None else min(stop, m)
        for i in range(start, stop):
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
        self.num_tokens += max(0, stop - start)
        self.num_seqs += stop == m and (start < stop or m == 0)
        log = self.log
        try:  # the tokens the new suffixes cover
            log.append((self.version, array("i", s[start : stop - 1 + depth]).tobytes()))
        except OverflowError:  # ids beyond int32: no log entry, so hints older than this are not trusted
            self.log_floor = self.version
        if len(log) > _LOG:
            self.log_floor = max(self.log_floor, log.popleft()[0])

    def remove(self, s: list[int], start: int = 0, stop: int | None = None) -> None:
        """Remove one occurrence of the suffixes of ``s`` starting at ``start <= i < stop`` (default: all; the
        exact inverse of ``insert`` with the same range)."""
        root, depth = self.root, self.depth
        m = len(s)
        stop = m if stop is None else min(stop, m)
        for i in range(start, stop):
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
        self.num_tokens -= max(0, stop - start)
        self.num_seqs -= stop == m and (start < stop or m == 0)

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
