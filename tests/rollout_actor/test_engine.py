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
