"""N-gram drafter: prompt-lookup decoding over the request's own tokens.

After prompt lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding) and vLLM's
``ngram`` proposer. Deterministic drafter: ``DraftTree.probs = None``.

Contract
--------
``propose`` is a pure function of each ``DraftRequest.token_ids`` (no history, no state; the lifecycle
hooks are no-ops). For ``g`` from ``max_ngram`` down to ``min_ngram``: find the most recent earlier
occurrence of the last ``g`` tokens (one that is followed by at least one token) and propose the tokens
that followed it, at most ``min(max_tokens[i], depth or max_tokens[i])`` of them and never past the end
of the context. The first ``g`` with an occurrence wins. Always a chain (``width`` is accepted and
ignored: a chain satisfies any width). ``DraftTree.score`` is the number of drafted tokens (each is a
point mass, like a count-1 suffix-tree path), so it is comparable with the suffix drafter's score.

The search runs in C: the ids are packed (``struct``) into a 4-byte-per-token buffer and ``bytes.rfind``
finds the pattern (a hit not aligned to a token boundary is skipped), so one request costs O(len) in C
plus O(1) Python work.

Tests: ``python -m pytest tests/rollout_actor/test_ngram.py -q``; cost:
``python -m benchmarks.drafter_propose_cost``.
"""

from __future__ import annotations

import struct

from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree

__all__ = ["NgramDrafter", "ngram_lookup"]

_ITEM = struct.calcsize("i")  # 4 bytes per token (ids must fit in int32)


def ngram_lookup(token_ids: list[int], max_ngram: int, min_ngram: int, k: int) -> tuple[list[int], int]:
    """Continuation of the most recent earlier occurrence of the longest matching suffix n-gram.

    Args:
        token_ids: ``[n]`` the context (prompt + output so far).
        max_ngram, min_ngram: n-gram sizes tried, longest first.
        k: the most tokens to return.

    Returns:
        ``(tokens, g)``: up to ``k`` tokens that followed the occurrence, and the matched n-gram size
        (``([], 0)`` when no size in range occurs earlier).
    """
    n = len(token_ids)
    if k <= 0 or n < min_ngram + 1:
        return [], 0
    buf = struct.pack(f"{n}i", *token_ids)
    w = _ITEM
    for g in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        pat = buf[(n - g) * w :]
        end = (n - 1) * w  # the occurrence must end before the last token: something follows it
        while True:
            pos = buf.rfind(pat, 0, end)
            if pos < 0:
                break
            if pos % w == 0:
                s = pos // w + g
                return list(token_ids[s : s + k]), g
            end = pos + len(pat) - 1  # misaligned hit: look for occurrences starting before it
    return [], 0


class NgramDrafter(Drafter):
    """Prompt-lookup drafter (see the module docstring).

    Args:
        max_ngram: longest suffix n-gram tried (tokens).
        min_ngram: shortest suffix n-gram tried (tokens, >= 1).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = int(max_ngram)
        self.min_ngram = int(min_ngram)

    def propose(
        self, requests: list[DraftRequest], max_tokens: list[int], width: int = 1, depth: int = 0
    ) -> list[DraftTree]:
        """One chain per request, ``len <= max_tokens[i]`` (and ``<= depth`` when ``depth > 0``)."""
        out: list[DraftTree] = []
        for req, budget in zip(requests, max_tokens):
            k = min(budget, depth) if depth > 0 else budget
            toks, _ = ngram_lookup(req.token_ids, self.max_ngram, self.min_ngram, k)
            out.append(DraftTree.chain(toks, None, float(len(toks))))
        return out
