"""CUDA graphs for the decode step: the model's forward captured once per (batch, context) bucket and replayed.

A decode step of a small model on a GPU is launch-bound: ~460 kernels, each a few microseconds of work, issued
one by one from Python (bench/gpu_profile.py saw the GPU busy 7% of a step). A captured graph issues them all
with one call. A graph fixes its shapes and its tensors' addresses, so a replayed step works on static buffers:

- the batch is padded up to a bucket size (1, 2, 4, 8, ... up to max_num_seqs), padding rows writing their
  K/V into a scratch block that no sequence holds and attending only that slot;
- each row attends its whole context through a block table padded to a context bucket (256, 512, ... tokens,
  up to the model's length), masked by its length (attention.StaticDecode); a step pays at most twice the
  attention of its longest row, and no shared-prefix (cascade) path;
- the inputs (token ids, positions, new slots, block tables, lengths) are views of one buffer of the graph's,
  filled by one copy a step, and the graph's output is read before the next replay.

Graphs are captured lazily, the first time a bucket is needed, in one memory pool (graphs never run at once).
Steps with a prefill chunk, a KV policy or speculative rows, or beyond the largest bucket, run eagerly as before.
`mode="static"` runs the same fixed-shape path without capturing anything: it is how the padding and masking are
tested on the CPU, where there are no graphs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

import torch

from mainspring.engine.attention import AttentionMetadata, StaticDecode
from mainspring.engine.transfers import upload

if TYPE_CHECKING:
    from mainspring.engine.model import CausalLM

log = logging.getLogger(__name__)

GraphMode = Literal["capture", "static"]
MIN_CONTEXT_BUCKET = 256


def buckets(limit: int, first: int = 1) -> list[int]:
    """Powers of two from `first` while below `limit`, then `limit` itself."""
    out = []
    size = first
    while size < limit:
        out.append(size)
        size *= 2
    return out + [limit]


def bucket_of(sizes: list[int], n: int) -> int | None:
    """The smallest bucket that holds `n`, or None when none does."""
    return next((size for size in sizes if size >= n), None)


@dataclass
class DecodeRow:
    token_id: int
    position: int  # of the new token; it attends position + 1 tokens
    block_table: list[int]


@dataclass
class _Bucket:
    """One captured shape: its input buffer, its output, and how to run it."""

    inputs: torch.Tensor  # [B * (4 + N)] on the device, laid out as `_views` says
    batch: int  # B
    width: int  # N, the block table's entries per row
    run: Callable[[], torch.Tensor]  # the replay (static mode: the forward itself); the output [B, hidden]


def _views(flat: torch.Tensor, b: int) -> tuple[torch.Tensor, ...]:
    """ids, positions, slots, lengths ([B] each) and block tables ([B, N]) in one flat buffer of `_Bucket`'s
    layout: a step fills them on the host and copies the whole buffer once, instead of five copies."""
    ids, positions, slots, lens = flat[: 4 * b].view(4, b).unbind(0)
    return ids, positions, slots, lens, flat[4 * b:].view(b, -1)


class DecodeGraphs:
    def __init__(self, model: CausalLM, kv_cache: list, scratch_block: int, block_size: int,
                 max_batch: int, max_context: int, mode: GraphMode = "capture") -> None:
        self.model, self.kv_cache, self.mode = model, kv_cache, mode
        self.scratch_block, self.block_size = scratch_block, block_size
        self.device = model.embed_tokens.weight.device
        self.batch_sizes = buckets(max_batch)
        top = -(-max_context // block_size) * block_size
        self.context_sizes = [-(-n // block_size) * block_size for n in buckets(top, min(MIN_CONTEXT_BUCKET, top))]
        self.graphs: dict[tuple[int, int], _Bucket] = {}
        self.pool: Any = None  # the graphs' shared memory pool, from the first capture
        self._rope_table = model.rope.cos  # graphs read this tensor; a grown table means capturing again
        self.replays = 0  # steps served by a graph (or, static, by the fixed-shape path)
        self.failed: str | None = None  # why a capture failed: then no step uses graphs
        scratch = slice(scratch_block * block_size, (scratch_block + 1) * block_size)
        for layer in kv_cache:
            layer[0][scratch].zero_()  # finite from the start: masked keys are read from here
            layer[1][scratch].zero_()

    def run(self, rows: list[DecodeRow]) -> torch.Tensor | None:
        """The hidden states [len(rows), hidden] of a decode-only step, or None when no bucket holds it (the
        caller runs it eagerly)."""
        b = bucket_of(self.batch_sizes, len(rows))
        c = bucket_of(self.context_sizes, max(r.position for r in rows) + 1)
        if b is None or c is None or not rows:
            return None
        if self.model.rope.cos.shape[0] <= max(r.position for r in rows):
            return None  # past the RoPE table: the eager step grows it
        if self.model.rope.cos is not self._rope_table:
            self.graphs.clear()  # they captured the old table's address
            self._rope_table = self.model.rope.cos
        graph = self.graphs.get((b, c))
        if graph is None:
            if self.failed is not None:
                return None
            try:
                graph = self._capture(b, c)
            except RuntimeError as exc:  # an op the graph cannot hold: every step stays eager, and says why
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("decode graphs off: capturing batch %d, context %d failed (%s); decoding eagerly",
                            b, c, self.failed)
                return None
        self._fill(graph, rows)
        out = graph.run()
        self.replays += 1
        return out[: len(rows)]

    def _fill(self, graph: _Bucket, rows: list[DecodeRow]) -> None:
        # one copy, not five; from pageable memory CUDA stages the bytes before it returns (engine/transfers.py)
        graph.inputs.copy_(self._inputs(graph.batch, graph.width, rows), non_blocking=True)

    def _inputs(self, b: int, n: int, rows: list[DecodeRow]) -> torch.Tensor:
        """A bucket's inputs on the host, in `_views`' layout: `rows`, then padding rows that write their K/V into
        the scratch block and attend only it; a row's unused table entries are the scratch block too."""
        bs = self.block_size
        ids, positions, slots, lens = [0] * b, [0] * b, [self.scratch_block * bs] * b, [1] * b
        tables = [[self.scratch_block] * n for _ in range(b)]
        for i, r in enumerate(rows):
            used = r.block_table[: -(-(r.position + 1) // bs)]
            ids[i], positions[i], lens[i] = r.token_id, r.position, r.position + 1
            slots[i] = used[r.position // bs] * bs + r.position % bs
            tables[i][: len(used)] = used
        return torch.tensor([*ids, *positions, *slots, *lens, *(x for row in tables for x in row)], dtype=torch.long)

    def _capture(self, b: int, c: int) -> _Bucket:
        dev, bs = self.device, self.block_size

        # padding rows only: until the first fill, warm-up and capture write only the scratch block
        n = c // bs
        inputs = upload(self._inputs(b, n, []), dev)
        ids, positions, slot_mapping, lens, tables = _views(inputs, b)
        meta = AttentionMetadata(slot_mapping, static=StaticDecode(tables, lens, bs, self.scratch_block * bs))

        def forward() -> torch.Tensor:
            return self.model(ids, positions, self.kv_cache, meta)

        run = forward
        if self.mode == "capture":
            run = self._graph(forward)
        graph = self.graphs[(b, c)] = _Bucket(inputs, b, n, run)
        return graph

    def _graph(self, forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # lazy initialisation (cuBLAS handles, workspaces) may not happen in capture
            forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        self.pool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay
