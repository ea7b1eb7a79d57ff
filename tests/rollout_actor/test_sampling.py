"""``SamplingBatch``: the processed distribution from host-known flags (the T = 1 shortcut included) equals the
one read from the device, bit for bit."""

import torch

from services.rollout_actor.requests import SamplingParams
from services.rollout_actor.sampling import SamplingBatch, processed_probs


def test_sampling_batch_probs_equal_processed_probs_read_from_the_tensors():
    vocab = 50
    logits = torch.randn(5, 3, vocab, generator=torch.Generator().manual_seed(0)) * 3
    cases = [
        [SamplingParams(temperature=1.0)] * 5,  # no top-k, no top-p, no greedy: softmax(logits) directly
        [SamplingParams(temperature=1.0, top_p=0.8)] * 5,  # T = 1 with top-p: the general path
        [SamplingParams(temperature=0.0)] * 5,  # all greedy
        [
            SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.7, top_k=4),
            SamplingParams(temperature=1.0, top_p=0.6),
            SamplingParams(temperature=1.3, top_k=vocab),  # top-k of the whole vocabulary: none
            SamplingParams(temperature=0.9, top_k=2, top_p=0.5),
        ],
    ]
    for params in cases:
        batch = SamplingBatch.of(params, vocab, "cpu")
        assert batch.greedy == tuple(p.temperature == 0 for p in params)
        assert batch.any_top_k == any(0 < p.top_k < vocab for p in params)
        assert batch.any_top_p == any(p.top_p < 1 for p in params)
        assert batch.unit_temperature == all(p.temperature == 1 for p in params)
        want = processed_probs(
            logits,
            batch.temperature.view(-1, 1).expand(5, 3),
            batch.top_k.view(-1, 1).expand(5, 3),
            batch.top_p.view(-1, 1).expand(5, 3),
        )
        assert torch.equal(batch.probs(logits), want)
        assert torch.equal(batch.probs(logits[:, 0]), want[:, 0])  # [B, V] as well as [B, T, V]
    # flags are trusted: a flag that says "no top-k" skips it even where a row asks for it
    batch = SamplingBatch.of([SamplingParams(temperature=1.0, top_k=2)], vocab, "cpu")
    cut = processed_probs(logits[:1, 0], 1.0, 2, 1.0, host_flags=(False, False, False))
    assert int((cut > 0).sum()) == vocab and int((batch.probs(logits[:1, 0]) > 0).sum()) == 2
