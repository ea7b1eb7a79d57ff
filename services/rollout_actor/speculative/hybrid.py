"""Hybrid drafter: per request, the suffix tree's draft when its score clears a threshold, else the learned one.

History repeats inside a GRPO group (siblings, earlier steps), where the suffix tree drafts long and cheaply;
new text is better drafted by the learned drafter. ``score`` is the suffix drafter's ``DraftTree.score`` (the
expected number of accepted tokens under its counts). Both sub-drafters see every start/observe/finish event,
unless ``forward_events=False`` (when the engine also holds the same sub-drafters under their own names and
already broadcasts every event to them: forwarding again would count a finished response twice).
"""

from __future__ import annotations

from services.rollout_actor.speculative.base import Drafter, DraftRequest, DraftTree


class HybridDrafter(Drafter):
    name = "hybrid"

    def __init__(
        self, suffix: Drafter, learned: Drafter, threshold: float = 1.0, forward_events: bool = True
    ):
        self.suffix, self.learned, self.threshold = suffix, learned, float(threshold)
        self.forward = forward_events
        self.used = {"suffix": 0, "learned": 0}

    @property
    def required_hidden_layers(self) -> tuple[int, ...]:
        return getattr(self.learned, "required_hidden_layers", ())

    def propose(
        self, requests: list[DraftRequest], max_tokens: list[int], width: int = 1, depth: int = 0
    ) -> list[DraftTree]:
        drafts = self.suffix.propose(requests, max_tokens, width, depth)
        weak = [i for i, d in enumerate(drafts) if len(d) == 0 or d.score < self.threshold]
        if weak:
            learned = self.learned.propose(
                [requests[i] for i in weak], [max_tokens[i] for i in weak], width, depth
            )
            for i, d in zip(weak, learned):
                drafts[i] = d
        self.used["learned"] += len(weak)
        self.used["suffix"] += len(drafts) - len(weak)
        return drafts

    def start_request(self, request_id: str, problem_id: str, prompt_ids: list[int]) -> None:
        if self.forward:
            self.suffix.start_request(request_id, problem_id, prompt_ids)
            self.learned.start_request(request_id, problem_id, prompt_ids)

    def observe(self, request_id: str, accepted_ids: list[int]) -> None:
        if self.forward:
            self.suffix.observe(request_id, accepted_ids)
            self.learned.observe(request_id, accepted_ids)

    def finish_request(self, request_id: str, problem_id: str, output_ids: list[int]) -> None:
        if self.forward:
            self.suffix.finish_request(request_id, problem_id, output_ids)
            self.learned.finish_request(request_id, problem_id, output_ids)

    def new_step(self, step: int) -> None:
        if self.forward:
            self.suffix.new_step(step)
            self.learned.new_step(step)

    def state_dict(self) -> dict:
        return {
            "suffix": self.suffix.state_dict(),
            "learned": self.learned.state_dict(),
            "used": dict(self.used),
        }

    def load_state_dict(self, state: dict) -> None:
        self.suffix.load_state_dict(state["suffix"])
        self.learned.load_state_dict(state["learned"])
        self.used = dict(state.get("used", self.used))
