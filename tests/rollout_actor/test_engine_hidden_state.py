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


def _oracle_engine(layers: tuple[int, ...], **kw) -> tuple[Transformer, Engine]:
    """A seeded 3-layer target and an engine drafting with ``OracleForSomeDrafter`` (3 tokens), keeping
    ``layers``' hidden states; ``kw``: more ``Engine`` arguments."""
    torch.manual_seed(0)
    target = init_weights(Transformer(tiny_config(num_hidden_layers=3, vocab_size=64)), seed=3).eval()
    drafters = {"oracle": OracleForSomeDrafter(target)}
    selector = FixedStrategy(Strategy("oracle", 3))
    eng = Engine(target, 4, 64, [], drafters=drafters, selector=selector, hidden_layers=layers, **kw)
    return target, eng


@pytest.mark.parametrize("layers", [(3,), (1, 3)])
def test_kept_hidden_state_is_the_state_after_the_last_committed_token(layers):
    target, eng = _oracle_engine(layers)
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


def test_hidden_sink_gets_every_committed_position_of_the_requests_the_filter_accepts():
    """``hidden_filter`` picks the requests whose hidden states reach ``hidden_sink`` (asked once per request);
    each row the sink gets is the target's state after reading that position's token (teacher-forced), the
    positions are consecutive and cover the whole output, whatever the drafts accepted."""
    layers = (1, 3)
    got: dict[str, list] = {}
    asked: list[str] = []

    def accept(rid: str) -> bool:
        asked.append(rid)
        return rid in ("r0", "r1")

    target, eng = _oracle_engine(
        layers,
        hidden_sink=lambda rid, pos, toks, h: got.setdefault(rid, []).append((pos, toks, h)),
        hidden_filter=accept,
    )
    prompts = [[5, 9, 2], [7, 1], [3, 3, 8, 1], [11, 4, 6]]
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    reqs = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    outs = eng.generate(reqs)
    assert sorted(asked) == ["r0", "r1", "r2", "r3"] and sorted(got) == ["r0", "r1"]
    for rid in got:
        i = int(rid[1:])
        seq = prompts[i] + outs[i].token_ids
        pos = [p for ps, _, _ in got[rid] for p in ps]
        toks = [t for _, ts, _ in got[rid] for t in ts]
        hid = torch.cat([h for _, _, h in got[rid]])  # [n, k, H]
        assert pos == list(range(len(prompts[i]), len(seq) - 1))  # every output token the target has read
        assert toks == [seq[p] for p in pos]
        with torch.inference_mode():
            ref = target(torch.tensor([seq[:-1]]), hidden_layers=layers).hidden
        want = torch.stack([ref[j][0, pos] for j in layers], 1)
        torch.testing.assert_close(hid, want, atol=1e-4, rtol=1e-4)
