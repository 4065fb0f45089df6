"""Turns one scheduled step into a forward pass: flat token batch, slots, attention metadata."""

from __future__ import annotations

import torch

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.model import CausalLM
from mainspring.engine.scheduler import ScheduledSeq
from mainspring.engine.sequence import Sequence


def kv_bytes_per_block(model: CausalLM, block_size: int) -> int:
    c = model.config
    return c.num_hidden_layers * 2 * block_size * c.num_key_value_heads * c.head_dim * 4


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        c = model.config
        self.model = model
        self.block_size = block_size
        # torch.empty: pages are only touched (and count as memory) once a block is written
        cache = torch.empty(c.num_hidden_layers, 2, num_blocks * block_size, c.num_key_value_heads, c.head_dim)
        self.kv_cache = [(cache[i, 0], cache[i, 1]) for i in range(c.num_hidden_layers)]

    @torch.inference_mode()
    def warmup(self) -> None:
        """One 1-token forward at start-up: weights may be memory-mapped, so this pages them in
        (and warms the kernels) before the first request pays for it. Writes one slot of block 0,
        which nothing holds yet."""
        meta = AttentionMetadata.build([], [([0], 0, 1)], self.block_size)
        self.model.compute_logits(self.model(torch.tensor([0]), torch.tensor([0]), self.kv_cache, meta))

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[torch.Tensor, list[Sequence]]:
        """Runs the step; returns logits of the sequences that sample, and those sequences.

        A sequence verifying draft tokens (speculative decoding) is a prefill chunk of its last
        token + drafts, causal over its context, and gets 1 + num_spec_tokens consecutive rows."""
        decodes = [s for s in scheduled if s.num_tokens == 1]
        prefills = [s for s in scheduled if s.num_tokens > 1]
        ids: list[int] = []
        positions: list[int] = []
        for s in decodes:
            pos = s.seq.num_computed_tokens
            ids.append(s.seq.token_ids[pos])
            positions.append(pos)
        for s in prefills:
            start = s.seq.num_computed_tokens
            ids.extend(s.token_ids)
            positions.extend(range(start, start + s.num_tokens))
        meta = AttentionMetadata.build(
            [(s.seq.block_table, s.seq.num_computed_tokens + 1) for s in decodes],
            [(s.seq.block_table, s.seq.num_computed_tokens, s.num_tokens) for s in prefills],
            self.block_size,
        )
        hidden = self.model(torch.tensor(ids), torch.tensor(positions), self.kv_cache, meta)
        rows, sampling = [], []
        for i, s in enumerate(decodes):
            if s.samples:
                rows.append(i)
                sampling.append(s.seq)
        offset = len(decodes)
        for s in prefills:
            offset += s.num_tokens
            if s.samples:
                rows.extend(range(offset - 1 - s.num_spec_tokens, offset))
                sampling.append(s.seq)
        if not rows:
            return torch.empty(0, self.model.config.vocab_size), []
        # the LM head is a fifth of the weights: only rows that sample need it
        return self.model.compute_logits(hidden[torch.tensor(rows)]), sampling
