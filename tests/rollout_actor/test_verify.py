"""Losslessness of speculative verification (services/rollout_actor/speculative/verify.py), proven by numbers.

How the tests prove it
----------------------
The target is a tiny fixed "language model": a bigram table ``P[last, next]`` over V = 4..5 tokens, built with
``sampling.processed_probs`` (temperature, top-k, top-p), so the plain-sampling joint distribution of the
first L emitted tokens is ``prod_i P[y_{i-1}, y_i]``. Drafters are small bigram processes too (sampled from a
table Q, i.i.d. or without replacement, or deterministic: argmax, random tokens, least likely, p = 0 tokens).

1. ``test_exact_joint_equals_plain_sampling``: a pure-Python reference of the acceptance rule returns every
   outcome of one verify step with its exact probability (branching on each accept test, and on every token
   of the final draw). Enumerating all draft trees with their exact draft probabilities and chaining verify
   steps (memoized on the last token) gives the exact joint of the first L speculatively emitted tokens, which
   must equal the plain-sampling joint to 1e-9 (fp64), for every root token.
2. ``test_verify_tree_matches_reference_cell_by_cell``: each reference outcome is a box of uniforms
   (``u[j] < a`` or ``>= a`` for the j-th test, and the final draw's inverse-CDF interval at ``u[t]``).
   ``verify_tree`` is run (batched) at the centre of every box of non-negligible width and must return that
   box's outcome. So the implementation has the reference's exact outcome distribution (and uniform use).
3. ``test_monte_carlo_joint`` runs the real speculative process with ``verify_tree`` (20,000 independent
   generations per case, fixed seed) and compares the empirical joint of the first L tokens with the exact
   plain-sampling joint by Pearson's chi-square (cells with expected count < 5 pooled; p-value from the
   regularized upper incomplete gamma). Threshold: p-value > 1e-4, i.e. a correct implementation fails a given
   seed with probability 1e-4; zero-probability sequences must never occur.
4. Negative controls show the checks can fail: the SpecInfer rule applied to siblings drawn *without*
   replacement is lossy (exact check and chi-square both detect it), and verify.py with a mutated residual
   (resample from p instead of the residual) fails both the cell probe and the chi-square test.
5. Greedy mode, chain fast path == tree walk, per-request independence of batching/padding, the algebra of
   ``residual``/``point_mass_residual`` (hand-computed values and hypothesis identities), argument errors.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.rollout_actor.sampling import processed_probs, sample_from_probs
from services.rollout_actor.speculative import verify as verify_mod
from services.rollout_actor.speculative.base import DraftTree
from services.rollout_actor.speculative.verify import (
    VerifyResult,
    point_mass_residual,
    residual,
    verify_chain,
    verify_tree,
)
from services.rollout_actor.verify_step import chain_accepted

MC_SAMPLES = 20_000
P_VALUE_MIN = 1e-4
EXACT_TOL = 1e-9


# --------------------------------------------------------------------------------------------------------------
# Tiny language models and drafters
# --------------------------------------------------------------------------------------------------------------


def make_table(vocab: int, seed: int, scale: float = 1.5, temperature=1.0, top_k=0, top_p=1.0, bias=None):
    """``[V, V]`` bigram table: row ``last`` is the processed distribution of the next token.

    Renormalized in fp64 so that the exact checks hold to 1e-9; verify_tree is fed its fp32 cast.
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=g) * scale
    if bias is not None:
        logits = logits + bias
    p = processed_probs(logits, temperature, top_k, top_p).double()
    return p / p.sum(-1, keepdim=True)


DistFn = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TinyDrafter:
    """Drafts a tree of fixed shape ``parents``; node i's token ~ ``dist(i, parent_token [m], prev_siblings [m, s])``.

    ``q_table`` set: ``DraftTree.probs[i] = q_table[parent token]`` (sampled drafter), else probs is None.
    """

    parents: list[int]
    dist: DistFn
    q_table: torch.Tensor | None = None
    iid: bool = True

    def parent_tokens(self, root: torch.Tensor, toks: torch.Tensor, i: int) -> torch.Tensor:
        par = self.parents[i]
        return root if par < 0 else toks[:, par]

    def siblings_before(self, i: int) -> list[int]:
        return [j for j in range(i) if self.parents[j] == self.parents[i]]

    def enumerate(self, root: int) -> list[tuple[tuple[int, ...], float]]:
        """Every possible draft (tokens) from context ``root`` with its exact probability."""
        out: list[tuple[tuple[int, ...], float]] = []
        n = len(self.parents)

        def rec(i: int, toks: list[int], w: float) -> None:
            if i == n:
                out.append((tuple(toks), w))
                return
            par = self.parents[i]
            ptok = torch.tensor([root if par < 0 else toks[par]])
            prev = torch.tensor([[toks[j] for j in self.siblings_before(i)]], dtype=torch.long).reshape(1, -1)
            d = self.dist(i, ptok, prev)[0].tolist()
            for v, dv in enumerate(d):
                if dv > 0:
                    rec(i + 1, toks + [v], w * dv)

        rec(0, [], 1.0)
        return out

    def sample(self, root: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``[m, N]`` draft tokens for contexts ``root [m]``."""
        m, n = root.shape[0], len(self.parents)
        toks = torch.zeros(m, n, dtype=torch.long)
        for i in range(n):
            prev = toks[:, self.siblings_before(i)]
            d = self.dist(i, self.parent_tokens(root, toks, i), prev)
            toks[:, i] = torch.multinomial(d.float(), 1, generator=gen).squeeze(1)
        return toks

    def trees(self, root: torch.Tensor, toks: torch.Tensor) -> list[DraftTree]:
        probs = None
        if self.q_table is not None:
            ptoks = torch.stack([self.parent_tokens(root, toks, i) for i in range(len(self.parents))], 1)
            probs = self.q_table[ptoks].float().unbind(0)  # m x [N, V]
        rows = toks.tolist()
        if probs is None:
            return [DraftTree(row, list(self.parents)) for row in rows]
        return [DraftTree(row, list(self.parents), pr, self.iid) for row, pr in zip(rows, probs)]

    def q_rule(self) -> list[bool]:
        """Documented policy: q rule iff probs are given and (i.i.d. siblings or the node is an only child)."""
        if self.q_table is None:
            return [False] * len(self.parents)
        counts = Counter(self.parents)
        return [self.iid or counts[par] == 1 for par in self.parents]


def sampled_dist(q_table: torch.Tensor, iid: bool = True) -> DistFn:
    def dist(i, ptok, prev):
        d = q_table[ptok].double().clone()
        if not iid and prev.shape[1]:
            d.scatter_(1, prev, 0.0)
            d = d / d.sum(1, keepdim=True)
        return d

    return dist


def rank_dist(score: torch.Tensor, descending: bool) -> DistFn:
    """Deterministic: the j-th sibling is the token of rank j in ``score[parent token]`` (ties: lowest id)."""
    vocab = score.shape[0]

    def dist(i, ptok, prev):
        rows = score[ptok].double()
        key = (-rows if descending else rows) * 4 * vocab + torch.arange(vocab, dtype=torch.float64) / vocab
        order = key.argsort(1)
        pick = order[:, prev.shape[1]]
        return torch.nn.functional.one_hot(pick, vocab).double()

    return dist


def uniform_dist(vocab: int) -> DistFn:
    return lambda i, ptok, prev: torch.full((ptok.shape[0], vocab), 1.0 / vocab, dtype=torch.float64)


def liar_first_dist(q_table: torch.Tensor) -> DistFn:
    """Node 0 is the lowest token with q = 0 (a drafter inconsistent with its own probs); others ~ q i.i.d."""
    base = sampled_dist(q_table)

    def dist(i, ptok, prev):
        if i > 0:
            return base(i, ptok, prev)
        zero_tok = (q_table[ptok] <= 0).double().argmax(1)
        return torch.nn.functional.one_hot(zero_tok, q_table.shape[0]).double()

    return dist


# --------------------------------------------------------------------------------------------------------------
# Pure-Python reference of the acceptance rule (fp64), with the box of uniforms of every outcome
# --------------------------------------------------------------------------------------------------------------


def _argmax(p: list[float]) -> int:
    return max(range(len(p)), key=lambda v: (p[v], -v))


def _norm_or(w: list[float], p: list[float]) -> list[float]:
    s = sum(w)
    if s <= 1e-12:
        w, s = p, sum(p)
    return [x / s for x in w]


def ref_residual(p: list[float], q: list[float]) -> list[float]:
    return _norm_or([max(0.0, a - b) for a, b in zip(p, q)], p)


def ref_pm_residual(p: list[float], x: int) -> list[float]:
    return _norm_or([0.0 if v == x else a for v, a in enumerate(p)], p)


Outcome = tuple[float, tuple[int, ...], int, tuple[tuple[int, float, float], ...]]


def ref_outcomes(tokens, parents, rows, qrows, q_rule, greedy=False) -> list[Outcome]:
    """All outcomes ``(prob, accepted path, next token, uniform box)`` of one verify step.

    rows[0] is p at the root, rows[1+i] after node i (fp64 lists); qrows[i] is node i's q (or None).
    The box lists ``(uniform index, lo, hi)``: the outcome happens iff every ``u[index]`` lies in [lo, hi).
    """
    kids = defaultdict(list)
    for i, par in enumerate(parents):
        kids[par].append(i)
    out: list[Outcome] = []

    def finish(p, path, t, prob, box):
        if greedy:
            out.append((prob, path, _argmax(p), box))
            return
        s, cum = sum(p), 0.0
        for y, py in enumerate(p):
            if py > 0:
                lo = cum / s
                cum += py
                out.append((prob * py / s, path, y, box + ((t, lo, cum / s),)))

    def walk(p, todo, path, t, prob, box):
        if not todo:
            finish(p, path, t, prob, box)
            return
        c, x = todo[0], tokens[todo[0]]
        if greedy:
            a = 1.0 if x == _argmax(p) else 0.0
        elif q_rule[c]:
            qx = qrows[c][x]
            a = min(1.0, p[x] / qx) if qx > 0 else 0.0
        else:
            a = p[x]
        if a > 0:
            walk(rows[1 + c], kids[c], path + (c,), t + 1, prob * a, box + ((t, 0.0, a),))
        if a < 1:
            if greedy:
                p2 = p
            elif q_rule[c]:
                p2 = ref_residual(p, qrows[c]) if qrows[c][x] > 0 else p
            else:
                p2 = ref_pm_residual(p, x)
            walk(p2, todo[1:], path, t + 1, prob * (1 - a), box + ((t, a, 1.0),))

    walk(rows[0], kids[-1], (), 0, 1.0, ())
    return out


def step_inputs(P64, drafter: TinyDrafter, root: int, toks: tuple[int, ...]):
    rows = [P64[root]] + [P64[t] for t in toks]
    qrows = None
    if drafter.q_table is not None:
        Q64 = drafter.q_table.double().tolist()
        qrows = [Q64[root if par < 0 else toks[par]] for par in drafter.parents]
    return rows, qrows


def exact_spec_joint(P: torch.Tensor, drafter: TinyDrafter, length: int, root: int, q_rule=None):
    """Exact joint of the first ``length`` tokens emitted by repeated (draft, verify) steps from ``root``."""
    P64 = P.double().tolist()
    q_rule = drafter.q_rule() if q_rule is None else q_rule
    memo: dict[tuple[int, int], dict[tuple[int, ...], float]] = {}

    def f(last: int, r: int) -> dict[tuple[int, ...], float]:
        if (last, r) in memo:
            return memo[(last, r)]
        out: dict[tuple[int, ...], float] = defaultdict(float)
        for toks, w in drafter.enumerate(last):
            rows, qrows = step_inputs(P64, drafter, last, toks)
            for prob, path, nxt, _ in ref_outcomes(toks, drafter.parents, rows, qrows, q_rule):
                if prob <= 0:
                    continue
                emitted = tuple(toks[i] for i in path) + (nxt,)
                if len(emitted) >= r:
                    out[emitted[:r]] += w * prob
                else:
                    for tail, pt in f(emitted[-1], r - len(emitted)).items():
                        out[emitted + tail] += w * prob * pt
        memo[(last, r)] = out
        return out

    return f(root, length)


def plain_joint(P: torch.Tensor, length: int, root: int) -> dict[tuple[int, ...], float]:
    P64 = P.double().tolist()
    vocab = len(P64)
    out = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, last = 1.0, root
        for y in seq:
            prob *= P64[last][y]
            last = y
        out[seq] = prob
    return out


def max_abs_diff(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# --------------------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    P: torch.Tensor
    drafter: TinyDrafter
    length: int
    mc_root: int = 0


def _cases() -> list[Case]:
    cases = []
    # 1. Sampled chain of 3 from an unrelated q.
    P = make_table(5, 1)
    Q = make_table(5, 2)
    cases.append(Case("chain3_sampled", P, TinyDrafter([-1, 0, 1], sampled_dist(Q), Q), 3))
    # 2. Deterministic argmax chain of 4 from another model ("greedy head"), top-k + temperature target.
    P = make_table(5, 3, temperature=0.8, top_k=3)
    D = make_table(5, 4)
    cases.append(Case("chain4_point_argmax_topk", P, TinyDrafter([-1, 0, 1, 2], rank_dist(D, True)), 3))
    # 3. Width-3 depth-1 tree, i.i.d. sampled siblings, top-p target.
    P = make_table(5, 5, top_p=0.8)
    Q = make_table(5, 6)
    cases.append(Case("tree_w3d1_iid_topp", P, TinyDrafter([-1, -1, -1], sampled_dist(Q), Q), 2))
    # 4. Width-2 depth-2 tree, i.i.d. sampled.
    P = make_table(4, 7)
    Q = make_table(4, 8, scale=0.7)
    cases.append(Case("tree_w2d2_iid", P, TinyDrafter([-1, -1, 0, 0, 1], sampled_dist(Q), Q), 2))
    # 5. Depth-3 tree of uniformly random tokens (point masses).
    P = make_table(4, 9)
    cases.append(Case("tree_d3_random_point", P, TinyDrafter([-1, -1, 0, 2], uniform_dist(4)), 3))
    # 6. Adversarial: width-3 depth-2 tree of the least likely tokens (p = 0 under top-k=2).
    P = make_table(5, 10, top_k=2)
    cases.append(
        Case("tree_w3d2_least_likely_topk", P, TinyDrafter([-1, -1, -1, 0, 0, 0], rank_dist(P, False)), 3)
    )
    # 7. Sampled chain whose q piles onto the target's p = 0 tokens (top-p target).
    P = make_table(5, 11, top_p=0.6)
    Q = make_table(5, 12, bias=torch.where(P > 0, 0.0, 4.0))
    cases.append(Case("chain3_sampled_wrong_topp", P, TinyDrafter([-1, 0, 1], sampled_dist(Q), Q), 3))
    # 8. Siblings without replacement, probs given, iid_siblings=False -> point-mass fallback for siblings.
    P = make_table(4, 13)
    Q = make_table(4, 14, scale=2.5)
    cases.append(
        Case("tree_norepl_fallback", P, TinyDrafter([-1, -1, -1, 0], sampled_dist(Q, False), Q, False), 2)
    )
    # 9. i.i.d. tree from a top-k-truncated q (q = 0 where p > 0), top-p target.
    P = make_table(5, 15, top_p=0.9)
    Q = make_table(5, 16, top_k=2)
    cases.append(Case("tree_iid_q_topk", P, TinyDrafter([-1, -1, 0, 1], sampled_dist(Q), Q), 2))
    # 10. Inconsistent drafter: node 0 has q(x) = 0 (never accepted, p unchanged), its sibling is a real draw.
    P = make_table(4, 17)
    Q = make_table(4, 18, top_k=2)
    cases.append(Case("tree_q_zero_token", P, TinyDrafter([-1, -1, 0], liar_first_dist(Q), Q), 2))
    # 11. Perfect drafter q == p (never rejects: whole paths and leaf bonus tokens), depth-3 i.i.d. tree.
    P = make_table(4, 19, top_k=3)
    cases.append(Case("tree_d3_iid_q_equals_p", P, TinyDrafter([-1, -1, 0, 2], sampled_dist(P), P), 3))
    return cases


CASES = _cases()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tensors here are tiny: intra-op threads only add overhead (a lot of it on a busy 2-core runner)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _norepl_misflagged() -> Case:
    """Negative control: siblings drawn without replacement but flagged i.i.d. (SpecInfer rule misapplied)."""
    P = make_table(4, 21, scale=1.0)
    Q = make_table(4, 22, scale=3.0)
    return Case("norepl_flagged_iid", P, TinyDrafter([-1, -1, -1], sampled_dist(Q, False), Q, True), 1)


# --------------------------------------------------------------------------------------------------------------
# 1. Exact losslessness of the rule
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_exact_joint_equals_plain_sampling(case: Case):
    vocab = case.P.shape[0]
    for root in range(vocab):
        spec = exact_spec_joint(case.P, case.drafter, case.length, root)
        plain = plain_joint(case.P, case.length, root)
        assert abs(sum(spec.values()) - 1.0) < EXACT_TOL
        assert max_abs_diff(spec, plain) < EXACT_TOL, f"root {root}"


def test_exact_check_detects_misapplied_iid_rule():
    """The SpecInfer rule needs i.i.d. siblings: on without-replacement siblings it is measurably lossy, while
    the point-mass fallback (what verify_tree does for iid_siblings=False) is exact."""
    case = _norepl_misflagged()
    plain = plain_joint(case.P, 1, 0)
    lossy = exact_spec_joint(case.P, case.drafter, 1, 0)
    assert max_abs_diff(lossy, plain) > 1e-2
    fallback = exact_spec_joint(case.P, case.drafter, 1, 0, q_rule=[False, False, False])
    assert max_abs_diff(fallback, plain) < EXACT_TOL


# --------------------------------------------------------------------------------------------------------------
# 2. verify_tree has the reference's exact outcome distribution (probed at the centre of every uniform box)
# --------------------------------------------------------------------------------------------------------------

MIN_BOX_WIDTH = 1e-4


def cell_probe(case: Case, roots: list[int], max_trees: int = 300, seed: int = 0) -> tuple[int, int, float]:
    """Run verify_tree at the centre of every outcome box; return (mismatches, probes, covered probability)."""
    P64 = case.P.double().tolist()
    d = case.drafter
    n_nodes = len(d.parents)
    g = torch.Generator().manual_seed(seed)
    rows_root, rows_tok, uniforms, expected = [], [], [], []
    covered, total = 0.0, 0.0
    for root in roots:
        drafts = d.enumerate(root)
        if len(drafts) > max_trees:
            pick = torch.randperm(len(drafts), generator=g)[:max_trees].tolist()
            drafts = [drafts[i] for i in pick]
        for toks, _ in drafts:
            rows, qrows = step_inputs(P64, d, root, toks)
            for prob, path, nxt, box in ref_outcomes(toks, d.parents, rows, qrows, d.q_rule()):
                total += prob
                if prob <= 0 or any(hi - lo < MIN_BOX_WIDTH for _, lo, hi in box):
                    continue
                covered += prob
                u = torch.rand(n_nodes + 1, generator=g, dtype=torch.float64)
                for j, lo, hi in box:
                    u[j] = (lo + hi) / 2
                rows_root.append(root)
                rows_tok.append(list(toks))
                uniforms.append(u)
                expected.append((list(path), nxt))
    root_t = torch.tensor(rows_root)
    tok_t = torch.tensor(rows_tok, dtype=torch.long).reshape(len(rows_root), n_nodes)
    target = case.P.float()[torch.cat([root_t[:, None], tok_t], 1)]
    res = verify_tree(target, d.trees(root_t, tok_t), torch.stack(uniforms))
    _check_result_consistency(res)
    got = list(zip(res.accepted_nodes, res.next_token.tolist()))
    mismatches = sum(1 for a, b in zip(got, [(p, n) for p, n in expected]) if a != b)
    return mismatches, len(expected), covered / total


def _check_result_consistency(res: VerifyResult) -> None:
    assert res.next_token.dtype == torch.long and res.num_accepted.dtype == torch.long
    assert res.num_accepted.tolist() == [len(a) for a in res.accepted_nodes]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_verify_tree_matches_reference_cell_by_cell(case: Case):
    mismatches, probes, covered = cell_probe(case, roots=list(range(case.P.shape[0])))
    assert probes > 0
    assert mismatches == 0, f"{mismatches}/{probes} outcome boxes differ from the reference"
    assert covered > 0.99  # the probed boxes carry (almost) all the probability


# --------------------------------------------------------------------------------------------------------------
# 3. Monte Carlo of the real speculative process with verify_tree
# --------------------------------------------------------------------------------------------------------------


def mc_counts(case: Case, n: int, seed: int, coupled: bool = False) -> Counter:
    """Empirical counts of the first ``length`` tokens of n speculative generations from ``case.mc_root``
    (``coupled``: the coupled point-mass rule, fresh uniforms per depth)."""
    d = case.drafter
    gen = torch.Generator().manual_seed(seed)
    target_table = case.P.float()
    seqs = torch.zeros(n, case.length, dtype=torch.long)
    filled = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), case.mc_root, dtype=torch.long)
    active = torch.arange(n)
    cols = torch.arange(len(d.parents) + 1)
    while active.numel():
        root = last[active]
        toks = d.sample(root, gen)
        target = target_table[torch.cat([root[:, None], toks], 1)]
        u = torch.rand(active.numel(), len(d.parents) + 1, generator=gen)
        res = verify_tree(target, d.trees(root, toks), u, coupled=coupled)
        # Emitted tokens of this step, left-aligned: accepted path tokens, then the next token.
        n_acc = res.num_accepted
        path = torch.tensor(
            [a + [0] * (len(d.parents) - len(a)) for a in res.accepted_nodes], dtype=torch.long
        )
        emitted = torch.cat([toks.gather(1, path.reshape(-1, len(d.parents))), res.next_token[:, None]], 1)
        emitted[torch.arange(active.numel()), n_acc] = res.next_token
        dest = filled[active, None] + cols  # where each emitted token goes in the sequence
        keep = (cols <= n_acc[:, None]) & (dest < case.length)
        rows = active[:, None].expand_as(dest)
        seqs[rows[keep], dest[keep]] = emitted[keep]
        filled[active] += n_acc + 1
        last[active] = res.next_token
        active = active[filled[active] < case.length]
    return Counter(map(tuple, seqs.tolist()))


def chi_square_pvalue(counts: Counter, probs: dict[tuple[int, ...], float], n: int) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled into one cell."""
    impossible = [k for k, c in counts.items() if probs.get(k, 0.0) <= 0 and c > 0]
    assert not impossible, f"zero-probability sequences emitted: {impossible[:5]}"
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for k, p in probs.items():
        if p <= 0:
            continue
        if n * p < 5:
            pool_o += counts.get(k, 0)
            pool_e += n * p
        else:
            obs.append(counts.get(k, 0))
            exp.append(n * p)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    o = torch.tensor(obs, dtype=torch.float64)
    e = torch.tensor(exp, dtype=torch.float64)
    stat = ((o - e) ** 2 / e).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("coupled", [False, True], ids=["sequential", "coupled"])
@pytest.mark.parametrize("idx", range(len(CASES)), ids=[c.name for c in CASES])
def test_monte_carlo_joint(idx: int, coupled: bool):
    """Both forms of the rule; with ``coupled`` the deterministic drafters take the coupled form and the sampled
    ones the sequential rule, mixed in one batch call where a case mixes them."""
    case = CASES[idx]
    counts = mc_counts(case, MC_SAMPLES, seed=1000 + idx + 7919 * coupled, coupled=coupled)
    assert sum(counts.values()) == MC_SAMPLES
    pval = chi_square_pvalue(counts, plain_joint(case.P, case.length, case.mc_root), MC_SAMPLES)
    assert pval > P_VALUE_MIN, f"chi-square p-value {pval:.2e}"


def test_monte_carlo_detects_misapplied_iid_rule():
    case = _norepl_misflagged()
    counts = mc_counts(case, MC_SAMPLES, seed=7)
    assert chi_square_pvalue(counts, plain_joint(case.P, 1, 0), MC_SAMPLES) < P_VALUE_MIN


def _resample_from_p(p, q):  # the classic bug: on rejection draw from p instead of the residual
    return p / p.sum(-1, keepdim=True)


def _resample_from_p_pm(p, x):
    return p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    "attr,fake", [("residual", _resample_from_p), ("point_mass_residual", _resample_from_p_pm)]
)
def test_checks_detect_mutated_residual(monkeypatch, attr, fake):
    """With the residual replaced by p (a real-world bug), both the cell probe and the chi-square test fail."""
    case = CASES[0] if attr == "residual" else CASES[1]
    monkeypatch.setattr(verify_mod, attr, fake)
    mismatches, probes, _ = cell_probe(case, roots=[0])
    assert mismatches > 0.05 * probes
    counts = mc_counts(case, MC_SAMPLES, seed=3)
    assert chi_square_pvalue(counts, plain_joint(case.P, case.length, case.mc_root), MC_SAMPLES) < P_VALUE_MIN


# --------------------------------------------------------------------------------------------------------------
# 4. Greedy mode
# --------------------------------------------------------------------------------------------------------------


def _random_tree(g: torch.Generator, vocab: int, n: int, width: int) -> DraftTree:
    parents: list[int] = []
    kids: Counter = Counter()
    for i in range(n):
        options = [j for j in range(-1, i) if kids[j] < width]
        par = options[int(torch.randint(len(options), (1,), generator=g))]
        parents.append(par)
        kids[par] += 1
    tokens = torch.randint(vocab, (n,), generator=g).tolist()
    return DraftTree(tokens, parents)


def _greedy_ref(tree: DraftTree, rows: torch.Tensor) -> tuple[list[int], int]:
    node, path = -1, []
    while True:
        best = _argmax(rows[node + 1].tolist())
        nxt = [c for c, par in enumerate(tree.parents) if par == node and tree.tokens[c] == best]
        if not nxt:
            return path, best
        node = nxt[0]
        path.append(node)


def test_greedy_accepts_exactly_while_argmax_matches():
    g = torch.Generator().manual_seed(5)
    vocab, B, N = 4, 400, 6
    # Quantized logits so that argmax ties happen often (ties -> lowest id).
    logits = torch.randint(0, 3, (B, N + 1, vocab), generator=g).float()
    target = torch.softmax(logits, -1)
    trees = []
    for b in range(B):
        n = int(torch.randint(0, N + 1, (1,), generator=g))
        tree = _random_tree(g, vocab, n, width=int(torch.randint(1, 4, (1,), generator=g)))
        # Bias drafts towards the argmax so that long accepted paths occur.
        for i in range(n):
            if torch.rand(1, generator=g) < 0.7:
                tree.tokens[i] = _argmax(target[b, tree.parents[i] + 1].tolist())
        trees.append(tree)
    greedy = torch.rand(B, generator=g) < 0.5
    u = torch.rand(B, N + 1, generator=g)
    res = verify_tree(target, trees, u, greedy=greedy)
    _check_result_consistency(res)
    n_long = 0
    for b in range(B):
        if greedy[b]:
            path, best = _greedy_ref(trees[b], target[b])
            assert (res.accepted_nodes[b], int(res.next_token[b])) == (path, best)
            n_long += len(path) >= 2
    assert n_long > 10
    # Greedy requests do not read their uniforms.
    res2 = verify_tree(target, trees, torch.rand(B, N + 1, generator=g), greedy=greedy)
    for b in range(B):
        if greedy[b]:
            assert res2.accepted_nodes[b] == res.accepted_nodes[b]
            assert res2.next_token[b] == res.next_token[b]


def test_greedy_matches_temperature_zero_sampling():
    """temperature=0 targets are one-hot, so the sampling rule must agree with greedy mode."""
    g = torch.Generator().manual_seed(6)
    vocab, B, N = 5, 200, 5
    target = processed_probs(torch.randint(0, 3, (B, N + 1, vocab), generator=g).float(), 0.0)
    trees = [_random_tree(g, vocab, N, width=2) for _ in range(B)]
    for b, t in enumerate(trees):
        t.tokens = [
            _argmax(target[b, par + 1].tolist()) if i % 2 == 0 else t.tokens[i]
            for i, par in enumerate(t.parents)
        ]
    u = torch.rand(B, N + 1, generator=g)
    a = verify_tree(target, trees, u)
    b_ = verify_tree(target, trees, u, greedy=torch.ones(B, dtype=torch.bool))
    assert a.accepted_nodes == b_.accepted_nodes
    assert torch.equal(a.next_token, b_.next_token)


# --------------------------------------------------------------------------------------------------------------
# 5. Chain fast path == tree walk; batching independence
# --------------------------------------------------------------------------------------------------------------


def _random_chain_batch(seed: int, B=300, K=5, vocab=6):
    g = torch.Generator().manual_seed(seed)
    target = processed_probs(torch.randn(B, K + 1, vocab, generator=g) * 2, 1.0, top_k=4)
    q = torch.softmax(torch.randn(B, K, vocab, generator=g) * 2, -1)
    # Drafts: mostly sampled from q, sometimes the argmax of the target (long accepts), sometimes q(x) = 0.
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(B, K)
    good = torch.rand(B, K, generator=g) < 0.4
    tokens = torch.where(good, target[:, :K].argmax(-1), tokens)
    q_zero = torch.nn.functional.one_hot(tokens, vocab).bool() & (torch.rand(B, K, 1, generator=g) < 0.1)
    q = q.masked_fill(q_zero, 0.0)
    q = q / q.sum(-1, keepdim=True)
    num = torch.randint(0, K + 1, (B,), generator=g)
    use_q = torch.rand(B, generator=g) < 0.5
    greedy = torch.rand(B, generator=g) < 0.2
    u = torch.rand(B, K + 1, generator=g)
    trees = [
        DraftTree.chain(tokens[b, : num[b]].tolist(), q[b, : num[b]] if use_q[b] else None) for b in range(B)
    ]
    return target, tokens, num, q, use_q, greedy, u, trees


def test_chain_fast_path_equals_tree_walk():
    target, tokens, num, q, use_q, greedy, u, trees = _random_chain_batch(11)
    walked = verify_mod._verify_tree_impl(target, trees, u, greedy, chain_fast_path=False)
    dispatched = verify_tree(target, trees, u, greedy)
    for res in (walked, dispatched):
        _check_result_consistency(res)
    assert walked.accepted_nodes == dispatched.accepted_nodes
    assert torch.equal(walked.next_token, dispatched.next_token)
    assert any(len(a) >= 3 for a in walked.accepted_nodes)
    # Public verify_chain on the all-q and all-point-mass halves.
    for mask, probs in ((use_q, q), (~use_q, None)):
        idx = mask.nonzero().squeeze(1)
        res = verify_chain(
            target[idx], tokens[idx], num[idx], None if probs is None else probs[idx], u[idx], greedy[idx]
        )
        assert res.accepted_nodes == [walked.accepted_nodes[i] for i in idx.tolist()]
        assert torch.equal(res.next_token, walked.next_token[idx])


def test_outcome_depends_only_on_own_row():
    g = torch.Generator().manual_seed(12)
    vocab, B, N = 5, 60, 6
    target = torch.softmax(torch.randn(B, N + 1, vocab, generator=g) * 2, -1)
    trees = []
    for b in range(B):
        t = _random_tree(g, vocab, int(torch.randint(0, N + 1, (1,), generator=g)), width=2)
        kind = b % 3
        if kind == 1:  # sampled, iid siblings
            t.probs = torch.softmax(torch.randn(len(t), vocab, generator=g), -1)
            t.iid_siblings = True
        elif kind == 2:  # probs given, siblings not iid
            t.probs = torch.softmax(torch.randn(len(t), vocab, generator=g), -1)
        trees.append(t)
    greedy = torch.rand(B, generator=g) < 0.2
    u = torch.rand(B, N + 1, generator=g)
    batched = verify_tree(target, trees, u, greedy)
    for b in range(B):
        n = len(trees[b])
        # Alone, with no padding and only the uniforms it needs ...
        alone = verify_tree(target[b : b + 1, : n + 1], [trees[b]], u[b : b + 1, : n + 1], greedy[b : b + 1])
        # ... and in a larger batch with garbage padding rows and extra uniform columns.
        pad = torch.softmax(torch.randn(2, N + 4, vocab, generator=g), -1)
        big_t = torch.cat([pad[:1], torch.cat([target[b : b + 1], pad[:1, :3]], 1), pad[1:]], 0)
        big_u = torch.cat(
            [
                torch.rand(1, N + 3, generator=g),
                torch.cat([u[b : b + 1], torch.rand(1, 2, generator=g)], 1),
                torch.rand(1, N + 3, generator=g),
            ],
            0,
        )
        other = [DraftTree.chain([0, 1, 2, 3, 4, 0, 1]), trees[b], DraftTree([1, 2], [-1, -1])]
        big = verify_tree(big_t, other, big_u, torch.tensor([False, bool(greedy[b]), True]))
        for res, i in ((alone, 0), (big, 1)):
            assert res.accepted_nodes[i] == batched.accepted_nodes[b]
            assert int(res.next_token[i]) == int(batched.next_token[b])


def test_empty_drafts_sample_from_root():
    target = torch.tensor([[[0.0, 0.25, 0.75]], [[1.0, 0.0, 0.0]]])
    u = torch.tensor([[0.2], [0.9]])
    res = verify_tree(target, [DraftTree(), DraftTree()], u)
    assert res.accepted_nodes == [[], []]
    assert res.next_token.tolist() == [1, 0]  # inverse CDF at 0.2 of [0, .25, .75] is token 1
    assert res.num_accepted.tolist() == [0, 0]


# --------------------------------------------------------------------------------------------------------------
# 5b. The coupled form: same tokens as plain sampling with position-keyed uniforms
# --------------------------------------------------------------------------------------------------------------


def _decode_bigram(
    P: torch.Tensor, drafter: TinyDrafter | None, u: torch.Tensor, coupled: bool
) -> list[list[int]]:
    """Decode ``u.shape[1]`` tokens per row from root token 0 of bigram table P, the token at output position t
    drawn with ``u[:, t]``: plainly (``drafter`` None: inverse CDF of P[last] at u[t]) or speculatively (each
    step verifies the drafter's tree with the uniforms of the positions it can reach)."""
    n, L = u.shape
    N = 0 if drafter is None else len(drafter.parents)
    table = P.float()
    gen = torch.Generator().manual_seed(3)
    out: list[list[int]] = [[] for _ in range(n)]
    last = torch.zeros(n, dtype=torch.long)
    while any(len(o) < L for o in out):
        act = torch.tensor([i for i in range(n) if len(out[i]) < L])
        pos = torch.tensor([len(out[i]) for i in act.tolist()])
        cols = (pos.unsqueeze(1) + torch.arange(N + 1)).clamp(max=L - 1)  # the positions this step may reach
        uu = u[act.unsqueeze(1), cols]
        root = last[act]
        if drafter is None:
            toks, trees = torch.zeros(len(act), 0, dtype=torch.long), [DraftTree() for _ in act]
        else:
            toks = drafter.sample(root, gen)
            trees = drafter.trees(root, toks)
        target = table[torch.cat([root[:, None], toks], 1)]
        res = verify_tree(target, trees, uu, coupled=coupled)
        for j, i in enumerate(act.tolist()):
            emitted = [trees[j].tokens[k] for k in res.accepted_nodes[j]] + [int(res.next_token[j])]
            out[i] += emitted[: L - len(out[i])]
            last[i] = out[i][-1]
    return out


@pytest.mark.parametrize(
    "name", ["chain4_point_argmax_topk", "tree_d3_random_point", "tree_w3d2_least_likely_topk"]
)
def test_coupled_rule_emits_the_tokens_of_plain_sampling(name: str):
    """With the uniform of output position t used for the token at t, a deterministic drafter's output is plain
    sampling's, token for token (the table rows are exact here; in the engine only float round-off between a
    verify forward and a decode forward can differ). The sequential rule with the same uniforms is as lossless
    but emits other tokens (negative control: the test can tell them apart)."""
    case = next(c for c in CASES if c.name == name)
    u = torch.rand(300, 8, generator=torch.Generator().manual_seed(21))
    plain = _decode_bigram(case.P, None, u, coupled=False)
    assert _decode_bigram(case.P, None, u, coupled=True) == plain  # no draft: both rules are one draw at u[0]
    coupled = _decode_bigram(case.P, case.drafter, u, coupled=True)
    assert coupled == plain
    sequential = _decode_bigram(case.P, case.drafter, u, coupled=False)
    assert sum(a != b for a, b in zip(sequential, plain)) > 30


def test_coupled_chain_fast_path_equals_walk_and_mixed_batches_split_by_rule():
    target, tokens, num, q, use_q, greedy, u, trees = _random_chain_batch(13)
    walked = verify_mod._verify_tree_impl(target, trees, u, greedy, chain_fast_path=False, coupled=True)
    fast = verify_tree(target, trees, u, greedy, coupled=True)
    assert walked.accepted_nodes == fast.accepted_nodes
    assert torch.equal(walked.next_token, fast.next_token)
    assert any(len(a) >= 3 for a in fast.accepted_nodes)
    sequential = verify_tree(target, trees, u, greedy)
    point = [b for b in range(len(trees)) if trees[b].probs is None]
    alone = verify_tree(target[point], [trees[b] for b in point], u[point], greedy[point], coupled=True)
    differs = 0
    for b in range(len(trees)):
        if trees[b].probs is not None or bool(
            greedy[b]
        ):  # sampled drafts keep the sequential rule; greedy is one rule
            assert fast.accepted_nodes[b] == sequential.accepted_nodes[b]
            assert int(fast.next_token[b]) == int(sequential.next_token[b])
        else:
            j = point.index(b)
            assert fast.accepted_nodes[b] == alone.accepted_nodes[j]
            assert int(fast.next_token[b]) == int(alone.next_token[j])
            differs += (fast.accepted_nodes[b], int(fast.next_token[b])) != (
                sequential.accepted_nodes[b],
                int(sequential.next_token[b]),
            )
    assert differs > 10  # the point-mass rows really took the other (coupled) form


def test_coupled_tree_walk_accepts_the_child_drawn_at_each_depth():
    g = torch.Generator().manual_seed(17)
    vocab, B, N = 3, 300, 7
    target = torch.softmax(torch.randn(B, N + 1, vocab, generator=g) * 2, -1)
    trees = [
        _random_tree(g, vocab, int(torch.randint(0, N + 1, (1,), generator=g)), width=3) for _ in range(B)
    ]
    u = torch.rand(B, N + 1, generator=g)
    res = verify_tree(target, trees, u, coupled=True)
    _check_result_consistency(res)
    deep = 0
    for b, t in enumerate(
        trees
    ):  # reference: draw at each depth, descend into the first child with that token
        node, path = -1, []
        while True:
            y = int(sample_from_probs(target[b, node + 1][None], u[b, len(path)][None]))
            kids = [c for c, par in enumerate(t.parents) if par == node and t.tokens[c] == y]
            if not kids:
                break
            node = kids[0]
            path.append(node)
        assert (res.accepted_nodes[b], int(res.next_token[b])) == (path, y)
        deep += len(path) >= 2
    assert deep > 10


@pytest.mark.parametrize("chains", [True, False])
def test_forced_tokens_replace_the_draws_so_a_step_emits_them_and_accepts_exactly_the_matching_nodes(chains):
    """Trace replay's form of the coupled rule: each depth's draw is replaced by the forced token (-1: the draw
    stands), so a row emits its forced tokens: the nodes on the path of forced tokens, then the first forced
    token without a matching child. Rows without forced tokens decode as without ``forced``."""
    g = torch.Generator().manual_seed(23)
    vocab, B, N = 4, 400, 6
    target = torch.softmax(torch.randn(B, N + 1, vocab, generator=g), -1)
    forced = torch.randint(0, vocab, (B, N + 1), generator=g)
    forced[::4] = -1  # every 4th row is not replayed
    trees = []
    for b in range(B):  # drafts that follow the forced tokens for a while (a chain, or a tree around them)
        n = int(torch.randint(0, N + 1, (1,), generator=g))
        if chains:
            toks = [
                int(forced[b, d])
                if d < n - 2 and forced[b, d] >= 0
                else int(torch.randint(0, vocab, (1,), generator=g))
                for d in range(n)
            ]
            trees.append(DraftTree(toks, list(range(-1, n - 1))))
        else:
            trees.append(_random_tree(g, vocab, n, width=3))
    u = torch.rand(B, N + 1, generator=g)
    res = verify_tree(target, trees, u, coupled=True, forced=forced)
    free = verify_tree(target, trees, u, coupled=True)
    _check_result_consistency(res)
    deep = 0
    for b, t in enumerate(trees):
        if forced[b, 0] < 0:
            assert (res.accepted_nodes[b], int(res.next_token[b])) == (
                free.accepted_nodes[b],
                int(free.next_token[b]),
            )
            continue
        node, path = -1, []
        while kids := [
            c for c, p in enumerate(t.parents) if p == node and t.tokens[c] == int(forced[b, len(path)])
        ]:
            node = kids[0]
            path.append(node)
        assert res.accepted_nodes[b] == path and int(res.next_token[b]) == int(forced[b, len(path)])
        deep += len(path) >= 2
    assert deep > 10
    with pytest.raises(ValueError, match="coupled"):
        verify_tree(target, trees, u, forced=forced)  # the sequential rule has no draws to replace
    with pytest.raises(ValueError, match="forced"):
        verify_tree(target, trees, u, coupled=True, forced=forced[:, :1])
    sampled = [trees[0], DraftTree([0], [-1], torch.full((1, vocab), 1.0 / vocab)), *trees[2:]]
    with pytest.raises(ValueError, match="sampled draft"):  # row 1 is replayed
        verify_tree(target, sampled, u, coupled=True, forced=forced)
    verify_tree(
        target, [sampled[1], *trees[1:]], u, coupled=True, forced=forced
    )  # row 0 is not: its rule stands


# --------------------------------------------------------------------------------------------------------------
# 6. Algebra of the residuals
# --------------------------------------------------------------------------------------------------------------


def test_residual_hand_computed():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.1, 0.2])
    # max(0, p - q) = [0.3, 0, 0.1, 0], mass 0.4
    torch.testing.assert_close(residual(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0]))
    # p == q: no residual mass -> falls back to p
    torch.testing.assert_close(residual(p, p.clone()), p)
    # batched, fp64 kept
    pb = torch.tensor([[[0.6, 0.4, 0.0]], [[0.1, 0.1, 0.8]]], dtype=torch.float64)
    qb = torch.tensor([[[0.2, 0.2, 0.6]], [[0.5, 0.5, 0.0]]], dtype=torch.float64)
    out = residual(pb, qb)
    assert out.dtype == torch.float64 and out.shape == (2, 1, 3)
    torch.testing.assert_close(
        out, torch.tensor([[[0.4 / 0.6, 0.2 / 0.6, 0.0]], [[0.0, 0.0, 1.0]]], dtype=torch.float64)
    )


def test_point_mass_residual_hand_computed():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.0, 1.0, 0.0], [0.25, 0.25, 0.5]])
    out = point_mass_residual(p, torch.tensor([0, 1, 2]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.6, 0.4], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))
    # equals residual(p, onehot(x) * p(x))
    x = torch.tensor([2, 0, 1])
    pm = torch.nn.functional.one_hot(x, 3) * p.gather(1, x[:, None])
    torch.testing.assert_close(point_mass_residual(p, x), residual(p, pm))


_prob_vec = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=6)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(_prob_vec, _prob_vec, st.data())
def test_residual_identities(pw, qw, data):
    vocab = min(len(pw), len(qw))
    p = torch.tensor(pw[:vocab], dtype=torch.float64)
    q = torch.tensor(qw[:vocab], dtype=torch.float64)
    if p.sum() <= 1e-6 or q.sum() <= 1e-6:
        return
    p, q = p / p.sum(), q / q.sum()
    r = residual(p, q)
    assert torch.all(r >= 0) and abs(float(r.sum()) - 1) < 1e-12
    overlap = torch.minimum(p, q)
    if 1 - overlap.sum() > 1e-9:
        # Leviathan et al. identity: accepted mass + rejection prob * residual = p
        torch.testing.assert_close(overlap + (1 - overlap.sum()) * r, p, atol=1e-12, rtol=0)
        assert torch.all(r[p <= q] == 0)
    x = data.draw(st.integers(0, vocab - 1))
    pm = point_mass_residual(p, torch.tensor(x))
    if p[x] < 1 - 1e-9:
        onehot = torch.nn.functional.one_hot(torch.tensor(x), vocab).double()
        torch.testing.assert_close(p[x] * onehot + (1 - p[x]) * pm, p, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------------------------------
# 7. Argument errors
# --------------------------------------------------------------------------------------------------------------


def test_shape_errors():
    t = torch.full((2, 3, 4), 0.25)
    u = torch.rand(2, 3)
    ok = [DraftTree.chain([1, 2]), DraftTree([1], [-1])]
    verify_tree(t, ok, u)
    bad_calls = [
        lambda: verify_tree(t[0], ok, u),  # not 3-D
        lambda: verify_tree(t, ok[:1], u),  # B mismatch
        lambda: verify_tree(t, [DraftTree.chain([1, 2, 3]), ok[1]], u),  # longer than N
        lambda: verify_tree(t, [DraftTree([1, 2], [-1, 1]), ok[1]], u),  # parent not before child
        lambda: verify_tree(t, [DraftTree.chain([1, 4]), ok[1]], u),  # token outside V
        lambda: verify_tree(
            t, [DraftTree.chain([1, 2], torch.full((2, 3), 1 / 3)), ok[1]], u
        ),  # probs [len, V]
        lambda: verify_tree(t, ok, u[:, :2]),  # too few uniforms
        lambda: verify_tree(t, ok, u[0]),  # uniforms not 2-D
        lambda: verify_tree(t, ok, u, greedy=torch.zeros(3, dtype=torch.bool)),
        lambda: verify_chain(t, torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 1]), None, u),
        lambda: verify_chain(t, torch.zeros(2, 2, dtype=torch.long), torch.tensor([3, 1]), None, u),
        lambda: verify_chain(
            t, torch.zeros(2, 2, dtype=torch.long), torch.tensor([2, 1]), torch.rand(2, 2, 3), u
        ),
        lambda: verify_chain(t, torch.full((2, 2), 7, dtype=torch.long), torch.tensor([2, 1]), None, u),
        lambda: residual(torch.rand(3), torch.rand(4)),
        lambda: point_mass_residual(torch.rand(2, 3), torch.tensor([0])),
        lambda: point_mass_residual(torch.rand(2, 3), torch.tensor([0, 3])),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    target, tokens, num, q, use_q, greedy, u, trees = _random_chain_batch(14)
    g = torch.Generator().manual_seed(15)
    tree_batch = [_random_tree(g, target.shape[-1], int(n), width=3) for n in num.tolist()]
    for t, qb in zip(tree_batch, q):
        t.probs, t.iid_siblings = qb[: len(t)], True
    for drafts in (trees, tree_batch):
        cpu = verify_tree(target, drafts, u, greedy)
        gpu = verify_tree(target.cuda(), drafts, u.cuda(), greedy.cuda())
        assert gpu.accepted_nodes == cpu.accepted_nodes
        assert torch.equal(gpu.next_token.cpu(), cpu.next_token)
    cpu = verify_chain(target, tokens, num, q, u, greedy)
    gpu = verify_chain(target.cuda(), tokens.cuda(), num.cuda(), q.cuda(), u.cuda(), greedy.cuda())
    assert gpu.accepted_nodes == cpu.accepted_nodes
    assert torch.equal(gpu.next_token.cpu(), cpu.next_token)


def test_chain_accepted_counts_the_accepted_nodes_of_the_first_child_chain():
    chain = DraftTree.chain([5, 6, 7, 8])
    assert [chain_accepted(chain, list(range(a))) for a in range(5)] == [0, 1, 2, 3, 4]
    # root -> 0 (first child) -> 2 (first child of 0) -> 4; siblings 1 (of 0) and 3 (of 2)
    tree = DraftTree([10, 11, 12, 13, 14], [-1, -1, 0, 0, 2])
    assert chain_accepted(tree, [0, 2, 4]) == 3  # the whole first-child chain
    assert chain_accepted(tree, [0, 3]) == 1  # left the chain at depth 2: that chain had 1 accepted
    assert chain_accepted(tree, [1]) == 0  # the root's second child: the chain's first node was rejected
    assert chain_accepted(tree, []) == 0
