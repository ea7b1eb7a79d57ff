"""Admission of waiting requests into KV-cache slots: prefill, prompt sharing, the first sampled token.

``AdmissionMixin`` is part of ``Engine`` (``engine.py``; its module docstring states the contract): it holds the
prompt-sharing bookkeeping (which prompt each slot's KV rows hold) and ``_admit``, which takes free slots for
waiting requests, copies or prefills their prompts' KV and samples each one's first token.
"""

from __future__ import annotations

import torch

from services.rollout_actor.requests import GenerationRequest, RequestOutput, RunningRequest


class AdmissionMixin:
    """Engine methods of admission (``engine.Engine`` sets every attribute they use)."""

    def forget_prompts(self) -> None:
        """Drop every held prompt (prompt sharing): call after changing the model's weights in place, when no
        request is running. ``generate`` does it on entry."""
        self._slot_prompt.clear()
        self._holders.clear()
        self._prompt_out.clear()

    def _new_generator(self, req: GenerationRequest) -> torch.Generator:
        seed = (
            req.params.seed
            if req.params.seed is not None
            else self.seed * 1_000_003 + next(self._seed_counter)
        )
        return torch.Generator().manual_seed(int(seed))

    def _take_slot(self, key: tuple[int, ...]) -> int:
        """A free slot for a request with prompt ``key``: one still holding that prompt if any (its KV is then
        kept in place), else the next free one, whose held prompt (if any) is forgotten."""
        if not self.prefix_sharing:
            return self.free_slots.pop()
        for s in self._holders.get(key, ()):
            if s in self.free_slots:
                self.free_slots.remove(s)
                return s
        slot = self.free_slots.pop()
        old = self._slot_prompt.pop(slot, None)
        if old is not None:
            hs = self._holders[old]
            hs.remove(slot)
            if not hs:
                del self._holders[old], self._prompt_out[old]
        return slot

    def _admit(self) -> list[RequestOutput]:
        new: list[RunningRequest] = []
        keys: list[tuple[int, ...]] = []
        while self.waiting and self.free_slots:
            req, arrival = self.waiting.popleft()
            gen = self._new_generator(req)
            u_pos = torch.rand(req.params.max_new_tokens + 1, generator=gen)
            key = tuple(req.prompt_ids)
            r = RunningRequest(req=req, slot=self._take_slot(key), gen=gen, u_pos=u_pos)
            r.to_sink = self.hidden_sink is not None and (
                self.hidden_filter is None or bool(self.hidden_filter(req.request_id))
            )
            r.timings.arrival_s = arrival
            new.append(r)
            keys.append(key)
        if not new:
            return []
        cache = self.cache
        # each row's prompt KV: kept or copied from a slot that holds the prompt, copied from a request of this
        # batch with the same prompt after the prefill, or prefilled (a leader); its (logits [V], hidden)
        row_out: list[tuple[torch.Tensor, torch.Tensor | None] | None] = [None] * len(new)
        leaders: list[int] = []
        leader_of: dict[tuple[int, ...], int] = {}
        later: list[tuple[int, int]] = []  # (row, leader row)
        for i, (r, key) in enumerate(zip(new, keys)):
            holders = self._holders.get(key) if self.prefix_sharing else None
            if holders:
                cache.copy_prefix(r.slot if r.slot in holders else holders[0], r.slot, len(key))
                row_out[i] = self._prompt_out[key]
            elif self.prefix_sharing and key in leader_of:
                later.append((i, leader_of[key]))
            else:
                leader_of[key] = i
                leaders.append(i)
        self.shared_prompts += len(new) - len(leaders)
        if leaders:
            dev = self.device
            lead = [new[i] for i in leaders]
            slots = torch.tensor([r.slot for r in lead], device=dev)
            cache.reset(slots)
            lens = torch.tensor([len(r.req.prompt_ids) for r in lead])
            t = int(lens.max())
            ids = torch.zeros(len(lead), t, dtype=torch.long)
            for j, r in enumerate(lead):
                ids[j, : lens[j]] = torch.tensor(r.req.prompt_ids)
            self.prefill_tokens += int(lens.sum())
            lens = lens.to(dev)
            out = self.model(
                ids.to(dev), cache=cache, slots=slots, hidden_layers=self.hidden_layers, logits_at=lens - 1
            )
            cache.commit(slots, lens)
            logits = out.logits[:, 0]  # [n_leaders, V]
            hid = self._gather_hidden(out.hidden, lens - 1)
            for j, i in enumerate(leaders):
                row_out[i] = (logits[j], hid[j] if hid is not None else None)
        for i, li in later:
            cache.copy_prefix(new[li].slot, new[i].slot, len(keys[i]))
            row_out[i] = row_out[li]
        if self.prefix_sharing:
            for i, (r, key) in enumerate(zip(new, keys)):
                if self._slot_prompt.get(r.slot) != key:
                    self._slot_prompt[r.slot] = key
                    self._holders.setdefault(key, []).append(r.slot)
                    self._prompt_out.setdefault(key, row_out[i])
        tokens, logps = self._sample_rows(torch.stack([o[0] for o in row_out]), new)  # one device read
        finished = []
        now = self.now()
        for i, r in enumerate(new):
            r.timings.first_token_s = now
            r.hidden = row_out[i][1]
            self.running.append(r)
            self._commit(r, [tokens[i]], [logps[i]])
            if r.finish_reason:
                finished.append(self._finish(r))
        return finished

    def _gather_hidden(self, hidden: dict[int, torch.Tensor], pos: torch.Tensor) -> torch.Tensor | None:
        """``[n, H]`` (one layer) or ``[n, k, H]`` (several) hidden states at ``pos[n]`` of each row."""
        if not self.hidden_layers:
            return None
        hs = [hidden[layer] for layer in self.hidden_layers]
        idx = pos.view(-1, 1, 1).expand(-1, 1, hs[0].shape[-1])
        picked = [h.gather(1, idx).squeeze(1) for h in hs]
        return picked[0] if len(picked) == 1 else torch.stack(picked, 1)
