"""Turns one scheduled step into a forward pass: flat token batch, slots, attention metadata."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mainspring.engine.attention import AttentionMetadata, SparseRow
from mainspring.engine.decode_graphs import DecodeGraphs, DecodeRow, GraphMode
from mainspring.engine.kv_cache import BlockManager
from mainspring.engine.kv_policy import SNAP_OBSERVE, plan_blocks, snap_plan
from mainspring.engine.model import CausalLM
from mainspring.engine.scheduler import ScheduledSeq
from mainspring.engine.sequence import Sequence
from mainspring.engine.transfers import upload

if TYPE_CHECKING:
    from mainspring.engine.kv_quant import ColdKVStore


def _offsets(start: int, chunks: list[ScheduledSeq]) -> list[int]:
    """The first row of each chunk in the flat batch (chunks follow the decode rows)."""
    out = []
    for s in chunks:
        out.append(start)
        start += s.num_tokens
    return out


def kv_bytes_per_block(model: CausalLM, block_size: int) -> int:
    c = model.config
    width = model.embed_tokens.weight.element_size()  # the KV cache is kept in the model's precision
    return c.num_hidden_layers * 2 * block_size * c.num_key_value_heads * c.head_dim * width


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int,
                 cold_store: ColdKVStore | None = None, graphs: GraphMode | None = None, max_batch: int = 64,
                 max_context: int = 0) -> None:
        """`graphs`: decode-only steps through engine/decode_graphs.py ("capture" on CUDA, "static" to run its
        fixed shapes eagerly), for up to `max_batch` rows of up to `max_context` tokens; None: all eager."""
        c = model.config
        self.model = model
        self.block_size = block_size
        # the device of the weights: on CUDA the step's index tensors are built on the host and sent in one go each
        self.device = model.embed_tokens.weight.device
        self._inv_freq = model.rope.inv_freq.cpu()  # what the host builds sparse rows' rotations from
        # torch.empty: pages are only touched (and count as memory) once a block is written. With graphs, one
        # block more than the block manager hands out: the scratch block padding rows write to
        slots = (num_blocks + (graphs is not None)) * block_size
        self.cache = torch.empty(c.num_hidden_layers, 2, slots, c.num_key_value_heads, c.head_dim,
                                 dtype=model.embed_tokens.weight.dtype, device=self.device)
        # the cold tier (kv_quant.ColdKVStore): quantized blocks that left a sequence's hot span
        self.cold_store = cold_store
        self.kv_cache = [self._layer_kv(i) for i in range(c.num_hidden_layers)]
        self.graphs = None if graphs is None else DecodeGraphs(
            model, self.kv_cache, num_blocks, block_size, max_batch, max_context or c.max_position_embeddings, graphs)

    def _layer_kv(self, i: int) -> tuple:
        k, v = self.cache[i, 0], self.cache[i, 1]
        if self.cold_store is None:
            return (k, v)
        store = self.cold_store
        return (k, v, lambda ids: store.load(i, ids))

    def apply_kv_policy(self, seqs: list[Sequence], block_manager: BlockManager) -> None:
        """After a step: release the blocks each policy-bound sequence no longer attends (behind
        its window) and quantize the ones that left its hot span into the cold store."""
        bs = self.block_size
        for seq in seqs:
            p = seq.kv_policy
            if p is None or not seq.block_table:
                continue
            if seq.snap_scores is not None:  # the prompt is in: SnapKV keeps what its last queries read
                scores, key_pos = seq.snap_scores
                seq.snap_scores, seq.kv_snapped = None, True
                evict = snap_plan(p, seq.block_table, seq.cold_blocks, seq.num_computed_tokens, scores, key_pos, bs)
                if evict:
                    block_manager.release(seq, evict)
            plan = plan_blocks(p, seq.block_table, seq.cold_blocks, seq.num_computed_tokens, bs,
                               seq.kv_drop_from, seq.kv_demote_from)
            seq.kv_drop_from, seq.kv_demote_from = plan.drop_to, plan.demote_to
            if plan.drop:
                block_manager.release(seq, plan.drop)
            demote = plan.demote
            if demote and self.cold_store is not None:
                # a full cold store leaves the rest hot: precision over memory, never an error
                demote = demote[: self.cold_store.num_free_blocks]
                if demote:
                    ids = self.cold_store.allocate(len(demote))
                    self._demote([seq.block_table[i] for i in demote], ids)
                    block_manager.release(seq, demote)
                    seq.cold_blocks.update(zip(demote, ids))

    def _demote(self, block_ids: list[int], cold_ids: list[int]) -> None:
        bs = self.block_size
        slots = (torch.tensor(block_ids)[:, None] * bs + torch.arange(bs)).flatten()
        kv = self.cache[:, :, upload(slots, self.device)]  # [L, 2, n*bs, KVH, D]
        shape = (kv.shape[0], len(block_ids), bs, *kv.shape[3:])
        assert self.cold_store is not None  # blocks are demoted only into a cold tier
        self.cold_store.store(torch.tensor(cold_ids), kv[:, 0].reshape(shape), kv[:, 1].reshape(shape))

    @torch.inference_mode()
    def warmup(self) -> None:
        """One 1-token forward at start-up: weights may be memory-mapped, so this pages them in
        (and warms the kernels) before the first request pays for it. Writes one slot of block 0,
        which nothing holds yet."""
        meta = AttentionMetadata.build([], [([0], 0, 1)], self.block_size).to(self.device)
        zero = upload([0], self.device, torch.long)
        self.model.compute_logits(self.model(zero, zero, self.kv_cache, meta))

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq], prompt_hidden: dict[int, tuple[int, torch.Tensor]] | None = None
                ) -> tuple[torch.Tensor, list[Sequence]]:
        """Runs the step; returns logits of the sequences that sample, and those sequences.

        A sequence verifying draft tokens (speculative decoding) is a prefill chunk of its last
        token + drafts, causal over its context, and gets 1 + num_spec_tokens consecutive rows.
        `prompt_hidden`, when given, gets seq_id -> (first position, hidden states) of the prompt
        tokens this step computed for each sequence that asks for prompt_logprobs: the LM head runs
        on those rows later, in slices, so a long chunk never makes one [tokens, vocab] tensor."""
        hidden, decodes, chunks = self._forward(scheduled)
        rows, sampling = [], []
        for i, s in enumerate(decodes):
            if s.samples:
                rows.append(i)
                sampling.append(s.seq)
        offset = len(decodes)
        for s in chunks:
            offset += s.num_tokens
            if s.samples:
                rows.extend(range(offset - 1 - s.num_spec_tokens, offset))
                sampling.append(s.seq)
        if prompt_hidden is not None:
            starts = list(range(len(decodes))) + _offsets(len(decodes), chunks)
            for first_row, s in zip(starts, decodes + chunks):
                # position p's logits score prompt token p + 1: the last prompt token scores nothing
                n = min(s.start + s.num_tokens, s.seq.num_prompt_tokens - 1) - s.start
                if s.seq.params.prompt_logprobs is not None and n > 0:
                    prompt_hidden[s.seq.seq_id] = (s.start, hidden[first_row:first_row + n])
        if not rows:
            return torch.empty(0, self.model.config.vocab_size, device=self.device), []
        # the LM head is a fifth of the weights: only rows that sample need it
        return self.model.compute_logits(hidden[upload(rows, self.device, torch.long)]), sampling

    @torch.inference_mode()
    def score(self, chunk: ScheduledSeq) -> torch.Tensor:
        """Logits of every row of one sequence's chunk (perplexity, not generation)."""
        hidden, _, _ = self._forward([chunk])
        return self.model.compute_logits(hidden)

    def _forward(self, scheduled: list[ScheduledSeq]):
        decodes = [s for s in scheduled if s.num_tokens == 1 and s.seq.kv_policy is None]
        prefills = [s for s in scheduled if s.num_tokens > 1 and s.seq.kv_policy is None]
        sparse = [s for s in scheduled if s.seq.kv_policy is not None]
        ids: list[int] = []
        positions: list[int] = []
        for s in decodes:
            pos = s.seq.num_computed_tokens
            ids.append(s.seq.token_ids[pos])
            positions.append(pos)
        chunks = prefills + sparse  # row order: decodes, prefill chunks, sparse segments
        if self.graphs is not None and decodes and not chunks:
            hidden = self.graphs.run([DecodeRow(ids[i], positions[i], s.seq.block_table)
                                      for i, s in enumerate(decodes)])
            if hidden is not None:
                return hidden, decodes, chunks
        for s in chunks:
            start = s.seq.num_computed_tokens
            ids.extend(s.token_ids)
            positions.extend(range(start, start + s.num_tokens))
        meta = AttentionMetadata.build(
            [(s.seq.block_table, s.seq.num_computed_tokens + 1) for s in decodes],
            [(s.seq.block_table, s.seq.num_computed_tokens, s.num_tokens) for s in prefills],
            self.block_size,
            [self._sparse_row(s) for s in sparse],
            self._inv_freq,
        ).to(self.device)
        dev = self.device
        hidden = self.model(upload(ids, dev, torch.long), upload(positions, dev, torch.long), self.kv_cache, meta)
        for s, seg in zip(sparse, meta.sparse):
            if seg.scores is not None:  # counted on the host (kv_policy.snap_plan): one copy per prompt
                assert seg.key_pos is not None  # set with the scores
                s.seq.snap_scores = (seg.scores.cpu(), seg.key_pos)
        return hidden, decodes, chunks

    @staticmethod
    def _sparse_row(s: ScheduledSeq) -> SparseRow:
        p = s.seq.kv_policy
        assert p is not None  # _forward routes only sequences under a policy here
        # SnapKV watches the chunk that completes a prompt, once per admission
        observe = SNAP_OBSERVE if p.snap_tokens is not None and not s.seq.kv_snapped and s.samples else 0
        return s.seq.block_table, s.seq.cold_blocks, s.seq.num_computed_tokens, s.num_tokens, p, observe
