"""Engine: continuous batching, reproducible per-request sampling, stops, and agreement with a cache-free pass."""

import pytest
import torch

from services.rollout_actor.engine import Engine, GenerationRequest, SamplingParams


def _req(i, prompt, **kw):
    return GenerationRequest(str(i), prompt, SamplingParams(**kw))


def test_greedy_matches_full_recompute(tiny_model):
    """Greedy tokens from the cached engine equal argmax of a cache-free forward over the whole prefix."""
    eng = Engine(tiny_model, max_batch_size=3, max_seq_len=128, eos_token_ids=[])
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [20]]
    outs = eng.generate([_req(i, p, temperature=0.0, max_new_tokens=12) for i, p in enumerate(prompts)])
    for p, o in zip(prompts, outs):
        seq = list(p)
        for tok in o.token_ids:
            with torch.no_grad():
                logits = tiny_model(torch.tensor([seq])).logits[0, -1]
            assert tok == int(logits.argmax())
            seq.append(tok)
        assert o.finish_reason == "length" and len(o.token_ids) == 12


def test_same_seed_same_tokens_regardless_of_batch(tiny_model):
    prompt = [3, 4, 5, 6]
    alone = Engine(tiny_model, max_batch_size=1, max_seq_len=128, eos_token_ids=[]).generate(
        [_req("a", prompt, temperature=1.0, max_new_tokens=20, seed=123)]
    )[0]
    crowd = [_req(f"x{i}", [7 + i, 8], temperature=1.0, max_new_tokens=5 + 3 * i, seed=i) for i in range(5)]
    mixed = Engine(tiny_model, max_batch_size=3, max_seq_len=128, eos_token_ids=[]).generate(
        crowd[:2] + [_req("a", prompt, temperature=1.0, max_new_tokens=20, seed=123)] + crowd[2:]
    )
    assert mixed[2].token_ids == alone.token_ids
    assert mixed[2].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other = Engine(tiny_model, max_batch_size=1, max_seq_len=128, eos_token_ids=[]).generate(
        [_req("a", prompt, temperature=1.0, max_new_tokens=20, seed=124)]
    )[0]
    assert other.token_ids != alone.token_ids


def test_continuous_batching_more_requests_than_slots(tiny_model):
    eng = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[])
    reqs = [_req(i, [i + 2, i + 3], temperature=0.8, max_new_tokens=3 + i, seed=i) for i in range(7)]
    outs = eng.generate(reqs)
    assert [len(o.token_ids) for o in outs] == [3 + i for i in range(7)]
    assert max(s.batch_size for s in eng.step_log) == 2
    assert all(o.timings.finish_s >= o.timings.first_token_s >= o.timings.arrival_s for o in outs)


def test_eos_stop(tiny_model):
    """With EOS = the greedy first token, generation stops right there with reason 'eos'."""
    with torch.no_grad():
        first = int(tiny_model(torch.tensor([[5, 6]])).logits[0, -1].argmax())
    eng = Engine(tiny_model, max_batch_size=1, max_seq_len=64, eos_token_ids=[first])
    out = eng.generate([_req(0, [5, 6], temperature=0.0, max_new_tokens=10)])[0]
    assert out.token_ids == [first] and out.finish_reason == "eos"


class _CharTok:
    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_stop_string(tiny_model):
    eng = Engine(tiny_model, max_batch_size=1, max_seq_len=64, eos_token_ids=[], tokenizer=_CharTok())
    free = eng.generate([_req(0, [5, 6], temperature=0.0, max_new_tokens=10)])[0]
    stop = free.text[2:4]
    eng = Engine(tiny_model, max_batch_size=1, max_seq_len=64, eos_token_ids=[], tokenizer=_CharTok())
    out = eng.generate([_req(0, [5, 6], temperature=0.0, max_new_tokens=10, stop=(stop,))])[0]
    assert out.finish_reason == "stop" and stop in out.text and len(out.token_ids) <= 4


def test_top_k_one_is_greedy(tiny_model):
    a = Engine(tiny_model, max_seq_len=64, eos_token_ids=[]).generate(
        [_req(0, [1, 2, 3], temperature=1.5, top_k=1, max_new_tokens=8, seed=5)]
    )[0]
    b = Engine(tiny_model, max_seq_len=64, eos_token_ids=[]).generate(
        [_req(0, [1, 2, 3], temperature=0.0, max_new_tokens=8)]
    )[0]
    assert a.token_ids == b.token_ids


def test_bad_requests(tiny_model):
    eng = Engine(tiny_model, max_seq_len=32, eos_token_ids=[])
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        eng.add_request(_req(0, [1, 2], max_new_tokens=40))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request(_req(1, [1, 999], max_new_tokens=4))
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        eng.add_request(_req(2, [1], max_new_tokens=4, stop=("x",)))


# ---------------------------------------------------------------------------------------------- prompt sharing
def _group_reqs(prompts, g, max_new_tokens=6):
    """``g`` sampled requests per prompt (a GRPO group each), distinct seeds."""
    return [
        GenerationRequest(
            f"{i}-{j}",
            p,
            SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens + (i + j) % 3, seed=100 * i + j),
            problem_id=f"p{i}",
        )
        for i, p in enumerate(prompts)
        for j in range(g)
    ]


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_prompt_sharing_prefills_each_prompt_once_and_keeps_the_tokens(tiny_model, slots):
    """Groups of 4 requests per prompt: with sharing, a prompt is prefilled once per stretch in which some slot
    holds it (here: once, as its group runs back to back), and every request decodes the same tokens and
    logprobs as with a prefill of its own."""
    prompts = [[3, 4, 5, 6, 7], [9, 10, 11], [20, 21, 22, 23, 24, 25, 26], [30, 31]]
    reqs = _group_reqs(prompts, 4)
    kw = dict(max_batch_size=slots, max_seq_len=64, eos_token_ids=[])
    plain = Engine(tiny_model, prefix_sharing=False, **kw)
    ref = plain.generate(reqs)
    eng = Engine(tiny_model, **kw)
    outs = eng.generate(reqs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    for a, b in zip(outs, ref):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert plain.prefill_tokens == 4 * sum(map(len, prompts)) and plain.shared_prompts == 0
    assert eng.prefill_tokens == sum(map(len, prompts)) and eng.shared_prompts == 12
    # the groups' responses still differ (own seeds): sharing the prompt did not share the sampling
    assert len({tuple(o.token_ids) for o in outs}) == len(outs)


def test_prompt_sharing_forgets_a_prompt_whose_slots_were_reused(tiny_model):
    """One slot, prompts A, B, A: B's prefill overwrites A's KV, so the second A is prefilled again (not read
    from stale rows), and all tokens match prefilling every request."""
    a, b = [3, 4, 5, 6, 7], [9, 10, 11]
    reqs = [_req(i, p, temperature=1.0, max_new_tokens=8, seed=i) for i, p in enumerate([a, a, b, a, a])]
    kw = dict(max_batch_size=1, max_seq_len=64, eos_token_ids=[])
    ref = Engine(tiny_model, prefix_sharing=False, **kw).generate(reqs)
    eng = Engine(tiny_model, **kw)
    outs = eng.generate(reqs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert eng.prefill_tokens == 2 * len(a) + len(b) and eng.shared_prompts == 2
    assert eng._holders == {tuple(a): [0]}  # only the last prompt's slot is remembered


def test_prompt_sharing_gives_followers_the_prompts_hidden_states(tiny_model):
    """The learned drafter reads the target hidden states of the last prompt position: a request that shares a
    prompt (copied in the same admission, or later from a running sibling) gets the same states as its own
    prefill would give, and its KV rows equal the leader's."""
    prompt = [3, 4, 5, 6, 7, 8]
    layers = (0, tiny_model.config.num_hidden_layers)

    def admitted(sharing, n):
        eng = Engine(
            tiny_model,
            max_batch_size=4,
            max_seq_len=64,
            eos_token_ids=[],
            hidden_layers=layers,
            prefix_sharing=sharing,
        )
        for i in range(n):
            eng.add_request(_req(i, prompt, temperature=1.0, max_new_tokens=5, seed=i))
        eng._admit()  # three at once: one leader, two copies
        eng.add_request(_req(9, prompt, temperature=1.0, max_new_tokens=5, seed=9))
        eng._admit()  # a fourth, later: copied from a running one
        return eng

    shared, own = admitted(True, 3), admitted(False, 3)
    assert shared.prefill_tokens == len(prompt) and own.prefill_tokens == 4 * len(prompt)
    for r, q in zip(shared.running, own.running):
        assert r.hidden.shape == q.hidden.shape == (len(layers), tiny_model.config.hidden_size)
        torch.testing.assert_close(r.hidden, q.hidden, atol=1e-5, rtol=1e-5)
    lead = shared.running[0].slot
    n = len(prompt)
    for r in shared.running[1:]:
        assert int(shared.cache.lengths[r.slot]) == n
        torch.testing.assert_close(shared.cache.k[:, r.slot, :, :n], shared.cache.k[:, lead, :, :n])
        torch.testing.assert_close(shared.cache.v[:, r.slot, :, :n], shared.cache.v[:, lead, :, :n])


def test_prompt_sharing_does_not_outlive_a_weight_change(tiny_model):
    """An engine kept across RL steps: after the weights change in place, the next ``generate`` prefills the
    same prompt again with the new weights (tokens equal a fresh engine's)."""
    prompt = [3, 4, 5, 6, 7]
    reqs = [_req(i, prompt, temperature=1.0, max_new_tokens=8, seed=i) for i in range(3)]
    eng = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[])
    eng.generate(reqs)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.mul_(1.5)
    again = eng.generate(reqs)
    fresh = Engine(tiny_model, max_batch_size=2, max_seq_len=64, eos_token_ids=[], prefix_sharing=False)
    assert [o.token_ids for o in again] == [o.token_ids for o in fresh.generate(reqs)]
    assert eng.prefill_tokens == 2 * len(prompt)


def test_mixed_batch_tokens_and_logprobs_match_a_cache_free_pass(tiny_model):
    """A batch mixing greedy, top-k, top-p and plain sampling rows: each row draws what it draws alone, greedy
    rows take the argmax, and every logprob is ``log_softmax(logits / T)`` of a cache-free forward (T = 1 for
    greedy rows)."""
    params = [
        dict(temperature=0.0),
        dict(temperature=0.7, top_k=5),
        dict(temperature=1.0, top_p=0.8),
        dict(temperature=1.3),
    ]
    reqs = [_req(i, [4 + i, 9, 11], max_new_tokens=10, seed=40 + i, **p) for i, p in enumerate(params)]
    mixed = Engine(tiny_model, max_batch_size=4, max_seq_len=64, eos_token_ids=[]).generate(reqs)
    for r, o, p in zip(reqs, mixed, params):
        alone = Engine(tiny_model, max_batch_size=1, max_seq_len=64, eos_token_ids=[]).generate([r])[0]
        assert o.token_ids == alone.token_ids and len(o.token_ids) == 10
        seq = list(r.prompt_ids)
        for tok, lp in zip(o.token_ids, o.logprobs):
            with torch.no_grad():
                logits = tiny_model(torch.tensor([seq])).logits[0, -1]
            if p["temperature"] == 0:
                assert tok == int(logits.argmax())
            want = torch.log_softmax(logits / (p["temperature"] or 1.0), -1)[tok]
            assert lp == pytest.approx(float(want), abs=1e-4)
            seq.append(tok)
