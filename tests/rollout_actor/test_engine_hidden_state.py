"""The hidden state the engine keeps per request (``RunningRequest.hidden``, what the learned drafter reads next) is
the target's state after the request's last committed token, whatever the draft accepted this step: checked
against an independent teacher-forced forward of prompt + committed tokens, for one kept layer (``[H]``) and
several (``[k, H]``), with rows of one batch accepting different numbers of draft tokens."""

from __future__ import annotations

import pytest
import torch

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams
from services.rollout_actor.model import Transformer, init_weights
from services.rollout_actor.speculative.base import Drafter, DraftTree
from services.rollout_actor.speculative.strategy import FixedStrategy, Strategy
from tests.conftest import tiny_config


class OracleForSomeDrafter(Drafter):
    """Proposes the target's own greedy continuation for requests whose id ends in an even digit (accepted in
    full under greedy decoding), and a token the target does not pick for the others (rejected at once)."""

    name = "oracle"

    def __init__(self, target: Transformer):
        self.target = target

    @torch.inference_mode()
    def propose(self, requests, max_tokens, width=1, depth=0):
        out = []
        for r, k in zip(requests, max_tokens):
            ids = list(r.token_ids)
            greedy = []
            for _ in range(k):
                nxt = int(self.target(torch.tensor([ids])).logits[0, -1].argmax())
                greedy.append(nxt)
                ids.append(nxt)
            if int(r.request_id[-1]) % 2:
                greedy = [(t + 1) % self.target.config.vocab_size for t in greedy[:1]]
            out.append(DraftTree.chain(greedy))
        return out


@pytest.mark.parametrize("layers", [(3,), (1, 3)])
def test_kept_hidden_state_is_the_state_after_the_last_committed_token(layers):
    torch.manual_seed(0)
    target = init_weights(Transformer(tiny_config(num_hidden_layers=3, vocab_size=64)), seed=3).eval()
    eng = Engine(
        target,
        max_batch_size=4,
        max_seq_len=64,
        eos_token_ids=[],
        drafters={"oracle": OracleForSomeDrafter(target)},
        selector=FixedStrategy(Strategy("oracle", 3)),
        hidden_layers=layers,
    )
    prompts = [[5, 9, 2], [7, 1], [3, 3, 8, 1], [11, 4, 6]]
    for i, p in enumerate(prompts):
        eng.add_request(GenerationRequest(f"r{i}", p, SamplingParams(temperature=0.0, max_new_tokens=12)))
    accepted_counts = set()
    for _ in range(3):
        before = {r.req.request_id: len(r.tokens) for r in eng.running}
        eng.step()
        for r in eng.running:
            if r.req.request_id in before:
                accepted_counts.add(len(r.tokens) - before[r.req.request_id])
            seq = r.req.prompt_ids + r.tokens
            with torch.inference_mode():
                ref = target(torch.tensor([seq[:-1]]), hidden_layers=layers).hidden
            # the state after reading the last committed input
            want = torch.stack([ref[j][0, -1] for j in layers])
            want = want[0] if len(layers) == 1 else want
            assert r.hidden.shape == want.shape
            torch.testing.assert_close(r.hidden, want, atol=1e-4, rtol=1e-4)
    # the batch mixed full acceptance (3 drafts + bonus) and immediate rejection (bonus only)
    assert {1, 4} <= accepted_counts
