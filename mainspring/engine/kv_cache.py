"""Paged KV-cache bookkeeping: a pool of fixed-size blocks, per-sequence block tables and
automatic prefix caching (vLLM / nano-vllm design).

Only ids and counts live here; the KV tensors live in the model runner and are indexed by
slot = block_id * block_size + offset. A FULL, computed block is identified by a chained
SHA-256 hash (parent hash, its tokens, the request's cache_salt), so two requests that share a
prefix share its blocks. Blocks whose ref_count drops to 0 go to an LRU free queue but keep their
hash, so they stay hittable until the allocator hands them out again.

With a disk tier (kv_offload.DiskKVTier) an evicted registered block is first written to disk, and
a lookup that misses in memory continues there: such a hit is loaded into a fresh block at
admission and registered like a computed one.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from mainspring.engine.sequence import Sequence

if TYPE_CHECKING:  # kv_offload imports torch; this module stays bookkeeping only
    from mainspring.engine.kv_offload import DiskKVTier
    from mainspring.engine.kv_quant import ColdKVStore


def hash_block_tokens(parent: bytes | None, token_ids: Seq[int], salt: str | None = None) -> bytes:
    """Chained hash of one full block.

    SHA-256 rather than Python's hash(): the cache may be shared between tenants, and a
    collision would leak one tenant's KV into another's answer. The salt only enters the first
    block; every later block inherits it through the parent hash. Markers keep the byte layout
    unambiguous (root vs child, no salt vs empty salt).
    """
    h = hashlib.sha256()
    if parent is None:
        if salt is None:
            h.update(b"R\x00")
        else:
            raw = salt.encode("utf-8")
            h.update(b"R\x01" + len(raw).to_bytes(4, "little") + raw)
    else:
        h.update(b"P" + parent)
    h.update(array("q", token_ids).tobytes())
    return h.digest()


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set once the block is full and its KV computed
    token_ids: tuple[int, ...] | None = None  # collision guard: compared on every hit
    parent_hash: bytes | None = None  # collision guard for the chain position
    salt: str | None = None  # collision guard for tenant isolation

    def _clear(self) -> None:
        self.hash = None
        self.token_ids = None
        self.parent_hash = None
        self.salt = None


@dataclass(frozen=True)
class KVCacheStats:
    num_blocks: int
    num_free_blocks: int  # ref_count 0, cached or not
    num_cached_blocks: int  # registered in the prefix cache (in use or free)
    usage: float  # fraction of blocks in use
    prefix_cache_queries: int  # prompt tokens looked up at admission
    prefix_cache_hits: int  # of which served from the cache

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks: list[Block] = [Block(i) for i in range(num_blocks)]
        # Free queue in eviction order: head = next to hand out (LRU), tail = most recently freed.
        # OrderedDict gives O(1) pop-head, push-tail and removal from the middle (on a hit).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}  # hash -> block id (one canonical block per hash)
        # Full prompt blocks a running seq is still computing: hash -> how many seqs compute it,
        # and per seq the (block index, hash) list not yet registered.
        self._pending: dict[bytes, int] = {}
        self._pending_of: dict[int, list[tuple[int, bytes]]] = {}
        self._queries = 0
        self._hits = 0
        # the cold tier's pool (kv_quant.ColdKVStore) when the engine has one: deallocate frees
        # a sequence's cold blocks there too
        self.cold_store: ColdKVStore | None = None
        # the disk tier when the engine has one: evicted prefix blocks spill to it, lookups continue on it
        self.disk: DiskKVTier | None = None

    # ---- pool state ---------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            num_blocks=self.num_blocks,
            num_free_blocks=self.num_free_blocks,
            num_cached_blocks=self.num_cached_blocks,
            usage=self.usage,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
        )

    def slot(self, seq: Sequence, position: int) -> int:
        """Where the KV of token `position` of `seq` lives in the flat slot space."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Slots for positions [start, end) (what a prefill chunk or decode step writes)."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def blocks_needed(self, seq: Sequence, upto: int | None = None) -> int:
        """Blocks that cover `seq`'s tokens [0, upto) (all by default), hit or fresh."""
        n = seq.num_tokens if upto is None else min(upto, seq.num_tokens)
        return (n + self.block_size - 1) // self.block_size

    # ---- prefix cache lookup -------------------------------------------------------------

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of `seq`'s longest cached chain up to its first disk hit (what `allocate`
        reuses as they are; without a disk tier, the whole chain)."""
        out: list[int] = []
        for x in self._match(seq):
            if isinstance(x, bytes):
                break
            out.append(x)
        return out

    def _match(self, seq: Sequence) -> list[int | bytes]:
        """The longest cached chain for `seq`: per block, its id if it is in memory, else its hash
        if the disk tier holds it.

        Only blocks fully inside token_ids[: num_tokens - 1] qualify: the last token is always
        recomputed (its logits are needed) and new KV must never land in a shared block.
        """
        if not self.enable_prefix_caching:
            return []
        bs, salt, disk = self.block_size, seq.cache_salt, self.disk
        chain: list[int | bytes] = []
        parent: bytes | None = None
        for i in range((seq.num_tokens - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash_block_tokens(parent, tokens, salt)
            bid = self._cached.get(h)
            if bid is not None:
                b = self.blocks[bid]
                # A hash match alone is not trusted: compare the content the hash stands for.
                if b.token_ids != tokens or b.parent_hash != parent or b.salt != salt:
                    break
                chain.append(bid)
            elif disk is not None and h in disk:
                # A disk block is trusted on its SHA-256 chain alone (parent, tokens and salt are all
                # hashed; the file only repeats the hash): no token comparison is possible here.
                chain.append(h)
            else:
                break
            parent = h
        return chain

    def waits_for_prefix(self, seq: Sequence) -> bool:
        """True if the next blocks of `seq`'s longest cached chain are being computed right now
        by a running sequence. Admitting `seq` a step later then reuses them instead of
        computing the same prefix twice (32 agents sharing one system prompt arrive together)."""
        if not self.enable_prefix_caching or not self._pending:
            return False
        bs, parent = self.block_size, None
        for i in range((seq.num_tokens - 1) // bs):
            h = hash_block_tokens(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
            if h not in self._cached:
                return h in self._pending
            parent = h
        return False

    def _fresh_needed(self, seq: Sequence, num_hits: int, limit: int | None) -> int:
        upto = None if limit is None else num_hits * self.block_size + limit
        return max(0, self.blocks_needed(seq, upto) - num_hits)

    def num_blocks_to_allocate(self, seq: Sequence, limit: int | None = None) -> int:
        """Free-pool blocks `allocate(seq, limit)` would consume: fresh blocks plus cache hits that
        are currently free (ref 0). Hits on blocks another sequence holds cost nothing."""
        return self._cost(seq, self._match(seq), limit)

    def _cost(self, seq: Sequence, chain: list[int | bytes], limit: int | None) -> int:
        """A disk hit is loaded into a fresh block. A memory hit after one costs a block even if
        another sequence holds it: should that load fail, everything after it is computed afresh."""
        n, after_disk = 0, False
        for x in chain:
            after_disk = after_disk or isinstance(x, bytes)
            n += after_disk or (isinstance(x, int) and self.blocks[x].ref_count == 0)
        return n + self._fresh_needed(seq, len(chain), limit)

    # ---- allocation ------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, limit: int | None = None) -> bool:
        return self.num_blocks_to_allocate(seq, limit) <= len(self._free)

    def allocate(self, seq: Sequence, limit: int | None = None) -> None:
        """Give a waiting `seq` blocks for all its tokens, reusing the longest cached prefix.
        With `limit`, only for the cached prefix and `limit` more tokens: a sliding-window sequence
        gets blocks chunk by chunk (may_append), so a long prompt never holds them all at once."""
        if seq.block_table:
            raise RuntimeError(f"sequence {seq.request_id!r} already holds blocks")
        chain = self._match(seq)
        if self._cost(seq, chain, limit) > len(self._free):
            raise RuntimeError(f"out of KV blocks for {seq.request_id!r}; call can_allocate first")
        # Take the memory hits out of the free queue BEFORE popping fresh blocks, so eviction
        # can never hand us a block we are about to reuse.
        for x in chain:
            if isinstance(x, int):
                b = self.blocks[x]
                if b.ref_count == 0:
                    del self._free[x]
                b.ref_count += 1
        # without a disk tier the chain holds block ids only
        table = self._load_chain(seq, chain) if self.disk is not None else cast("list[int]", chain)
        hits = len(table)
        table.extend(self._pop_free() for _ in range(self._fresh_needed(seq, hits, limit)))
        seq.block_table = table
        cached = hits * self.block_size
        seq.num_cached_tokens = cached
        seq.num_computed_tokens = cached
        if seq.usage_cached_tokens is None:
            seq.usage_cached_tokens = cached
        if self.enable_prefix_caching:
            self._queries += seq.num_tokens
            self._hits += cached
            self._track_pending(seq, hits)

    def _load_chain(self, seq: Sequence, chain: list[int | bytes]) -> list[int]:
        """Block ids for `chain`: memory hits as they are, disk hits loaded into fresh blocks and
        registered. A failed load (file gone or corrupt) ends the chain there; the rest is computed."""
        bs, disk = self.block_size, self.disk
        assert disk is not None  # allocate calls this only with a disk tier
        table: list[int] = []
        for i, x in enumerate(chain):
            if isinstance(x, bytes):
                bid = self._pop_free()  # may spill an evicted block to disk first
                if not disk.load(bid, x):
                    self._release(bid)  # unhashed: back to the head of the free queue
                    for y in chain[i + 1 :]:
                        if isinstance(y, int):
                            self._release(y)
                    break
                parent = self.blocks[table[-1]].hash if table else None
                self._register(self.blocks[bid], x, tuple(seq.token_ids[i * bs : (i + 1) * bs]), parent,
                               seq.cache_salt)
                x = bid
            table.append(x)
        return table

    def _track_pending(self, seq: Sequence, first: int) -> None:
        bs = self.block_size
        parent = self.blocks[seq.block_table[first - 1]].hash if first else None
        pending = []
        for i in range(first, seq.num_tokens // bs):
            parent = hash_block_tokens(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.cache_salt)
            pending.append((i, parent))
            self._pending[parent] = self._pending.get(parent, 0) + 1
        if pending:
            self._pending_of[seq.seq_id] = pending

    def _untrack_pending(self, seq: Sequence, below: int | None = None) -> None:
        """Drop `seq`'s pending blocks with index < below (all if None)."""
        pending = self._pending_of.get(seq.seq_id)
        while pending and (below is None or pending[0][0] < below):
            _, h = pending.pop(0)
            n = self._pending[h] - 1
            if n:
                self._pending[h] = n
            else:
                del self._pending[h]
        if not pending:
            self._pending_of.pop(seq.seq_id, None)

    def _pop_free(self) -> int:
        bid, _ = self._free.popitem(last=False)
        b = self.blocks[bid]
        # Evict: the block's old content is about to be overwritten.
        if b.hash is not None and self._cached.get(b.hash) == bid:
            del self._cached[b.hash]
            if self.disk is not None:
                self.disk.save(bid, b.hash)
        b._clear()
        b.ref_count = 1
        return bid

    def _release(self, bid: int) -> None:
        b = self.blocks[bid]
        b.ref_count -= 1
        if b.ref_count < 0:
            raise RuntimeError(f"block {bid} ref_count went negative")
        if b.ref_count == 0:
            self._free[bid] = None
            if b.hash is None or self._cached.get(b.hash) != bid:
                # Nothing can ever hit this block (partial, or a duplicate of a registered
                # block): hand it out before any block that still caches a prefix.
                self._free.move_to_end(bid, last=False)

    def release(self, seq: Sequence, indices: list[int]) -> None:
        """Let go of some of `seq`'s blocks (a KV policy: behind the window, or demoted to the cold
        tier). The entries read -1; a hashed block stays hittable in the prefix cache."""
        for i in indices:
            bid = seq.block_table[i]
            if bid >= 0:
                self._release(bid)
                seq.block_table[i] = -1
            cid = seq.cold_blocks.pop(i, None)
            if cid is not None:
                assert self.cold_store is not None  # cold blocks exist only with a cold tier
                self.cold_store.free([cid])

    def deallocate(self, seq: Sequence) -> None:
        """Release `seq`'s blocks (finish, abort or preemption)."""
        # Reverse order: the deepest prefix blocks are least likely to be shared by a future
        # request, so they reach the free queue first and are evicted first.
        for bid in reversed(seq.block_table):
            if bid >= 0:
                self._release(bid)
        if seq.cold_blocks:
            assert self.cold_store is not None  # cold blocks exist only with a cold tier
            self.cold_store.free(list(seq.cold_blocks.values()))
            seq.cold_blocks = {}
        seq.kv_drop_from = seq.kv_demote_from = 0
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        self._untrack_pending(seq)

    # ---- decode ------------------------------------------------------------------------------

    def _missing_blocks(self, seq: Sequence, num_lookahead: int = 0, upto: int | None = None) -> int:
        n = seq.num_tokens if upto is None else min(upto, seq.num_tokens)
        needed = (n + num_lookahead + self.block_size - 1) // self.block_size
        return max(0, needed - len(seq.block_table))

    def can_append(self, seq: Sequence, num_lookahead: int = 0, upto: int | None = None) -> bool:
        """True if a slot exists (or can be made) for every token of `seq` (or those before
        `upto`), normally the newest, plus `num_lookahead` slots after it (speculative drafts)."""
        return self._missing_blocks(seq, num_lookahead, upto) <= len(self._free)

    def may_append(self, seq: Sequence, num_lookahead: int = 0, upto: int | None = None) -> None:
        missing = self._missing_blocks(seq, num_lookahead, upto)
        if missing > len(self._free):
            raise RuntimeError(f"out of KV blocks for {seq.request_id!r}; call can_append first")
        seq.block_table.extend(self._pop_free() for _ in range(missing))

    def free_lookahead(self, seq: Sequence) -> None:
        """Give back the blocks past `seq`'s last token: lookahead slots reserved for draft tokens
        that were rejected. They were never full and computed, so never hashed; they go to the
        head of the free queue, to be handed out before any block that still caches a prefix."""
        keep = self.blocks_needed(seq)
        for bid in reversed(seq.block_table[keep:]):
            b = self.blocks[bid]
            if b.ref_count != 1 or b.hash is not None:
                raise RuntimeError(f"lookahead block {bid} is shared or cached")
            b.ref_count = 0
            self._free[bid] = None
            self._free.move_to_end(bid, last=False)
        del seq.block_table[keep:]

    def mark_computed(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Register every block of `seq` that is full and computed up to `num_computed_tokens`.

        Only call with tokens that are final (e.g. accepted, not merely drafted): a registered
        block is served to other requests as-is.
        """
        if not self.enable_prefix_caching:
            return
        bs, table = self.block_size, seq.block_table
        full = min(num_computed_tokens, seq.num_tokens) // bs
        full = min(full, len(table))
        # Walk back to the first unhashed block; normally zero or one block per step.
        i = full
        while i > 0 and table[i - 1] >= 0 and self.blocks[table[i - 1]].hash is None:
            i -= 1
        if i > 0 and table[i - 1] < 0:
            # released by a KV policy: its hash is gone with it, so no later block can chain
            # onto it; those blocks stay unregistered (a windowed sequence's deep blocks are
            # unlikely to be shared anyway)
            self._untrack_pending(seq, below=full)
            return
        parent = self.blocks[table[i - 1]].hash if i > 0 else None
        for j in range(i, full):
            b = self.blocks[table[j]]
            tokens = tuple(seq.token_ids[j * bs : (j + 1) * bs])
            h = hash_block_tokens(parent, tokens, seq.cache_salt)
            self._register(b, h, tokens, parent, seq.cache_salt)
            parent = h
        self._untrack_pending(seq, below=full)

    def _register(self, b: Block, h: bytes, tokens: tuple[int, ...], parent: bytes | None, salt: str | None) -> None:
        b.hash, b.token_ids, b.parent_hash, b.salt = h, tokens, parent, salt
        # An identical block already registered wins; ours stays an unregistered duplicate
        # (block tables are append-only, so we never swap a table entry).
        self._cached.setdefault(h, b.block_id)

    def registered_blocks(self) -> list[tuple[int, bytes]]:
        """(block id, hash) of every registered block, least recently used first: free ones in
        eviction order, then the ones in use (what a flush to the disk tier writes)."""
        held = [bid for bid in self._cached.values() if self.blocks[bid].ref_count]
        blocks = ((bid, self.blocks[bid].hash) for bid in [*self._free, *held])
        return [(bid, h) for bid, h in blocks if h is not None and self._cached.get(h) == bid]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after weights change). Refused (False) while any
        block is in use, since running requests would re-register stale blocks."""
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        for b in self.blocks:
            b._clear()
        return True
