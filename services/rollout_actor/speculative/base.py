"""The one interface every drafter implements, and the draft it returns.

A draft is a token tree rooted at the request's last committed token (the root itself is not part of the
draft). A chain is the tree whose node i has parent i - 1. Node order is a topological order (a parent comes
before its children) and siblings appear in the order verification should try them.

Deterministic drafters (suffix tree, n-gram, a greedy learned drafter) leave ``probs`` as ``None``: the
verifier then treats each node as a point mass (accept with p(x)). Sampled drafters set ``probs[i]`` to the
draft distribution q that node i was drawn from (the distribution at its parent), and ``iid_siblings`` says
whether siblings were drawn i.i.d. from that q (SpecInfer rule) or not (then the point-mass rule applies).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """Draft for one request.

    tokens:  ``[N]`` token ids of the draft nodes.
    parents: ``[N]`` index of each node's parent node, -1 for a child of the root; ``parents[i] < i``.
    probs:   ``[N, V]`` fp32 draft distribution each node was sampled from, or None (deterministic).
    iid_siblings: siblings were drawn i.i.d. from ``probs`` (only meaningful when probs is set).
    score:   drafter's confidence (e.g. the suffix tree's summed path probability); used by ``hybrid``.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None
    iid_siblings: bool = False
    score: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def chain(tokens: list[int], probs: torch.Tensor | None = None, score: float = 0.0) -> DraftTree:
        return DraftTree(list(tokens), list(range(-1, len(tokens) - 1)), probs, False, score)

    def depths(self) -> list[int]:
        """Depth of each node (1 for a child of the root)."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))


@dataclass
class DraftRequest:
    """What a drafter sees of one running request at propose time.

    request_id: engine request id.
    problem_id: key shared by all responses to the same prompt (a GRPO group and later steps' groups).
    token_ids:  prompt followed by the tokens generated so far (the last one is the tree's root).
    num_prompt_tokens: length of the prompt prefix of ``token_ids``.
    hidden: ``[H]`` or ``[n_layers, H]`` target hidden state(s) at the root, for learned drafters; else None.
    """

    request_id: str
    problem_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    hidden: torch.Tensor | None = None


class Drafter(ABC):
    """Base class. One instance serves every request of one engine."""

    name: str = "base"

    @abstractmethod
    def propose(
        self, requests: list[DraftRequest], max_tokens: list[int], width: int = 1, depth: int = 0
    ) -> list[DraftTree]:
        """Propose one draft per request.

        Args:
            requests: the requests to draft for.
            max_tokens: per request, the most draft nodes allowed (0 means propose nothing).
            width: the most children per node (1 = chain).
            depth: the most levels (0 = as deep as max_tokens allows).

        Returns:
            One ``DraftTree`` per request, each with ``len(tree) <= max_tokens[i]`` (empty is allowed).
        """

    def start_request(self, request_id: str, problem_id: str, prompt_ids: list[int]) -> None:  # noqa: B027
        """A request entered the engine."""

    def observe(self, request_id: str, accepted_ids: list[int]) -> None:  # noqa: B027
        """Tokens just committed for the request (accepted draft tokens plus the bonus/correction)."""

    def finish_request(self, request_id: str, problem_id: str, output_ids: list[int]) -> None:  # noqa: B027
        """The request finished with these generated tokens (history-based drafters learn from them)."""

    def new_step(self, step: int) -> None:  # noqa: B027
        """An RL step began (drafters with step windows age out history)."""

    def flush(self) -> None:  # noqa: B027
        """Do deferred history work (``finish_request`` may only queue it): the rollout worker calls this after
        a rollout, in a background thread, off the decode path."""

    def state_dict(self) -> dict:
        """Picklable state for checkpointing."""
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027
        """Restore from ``state_dict()``."""
