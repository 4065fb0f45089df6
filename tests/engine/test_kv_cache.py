"""BlockManager: paged allocation, ref counts, chained-hash prefix caching and LRU eviction."""

from __future__ import annotations

import pytest

from mainspring.engine import kv_cache
from mainspring.engine.kv_cache import BlockManager, hash_block_tokens
from mainspring.engine.params import SamplingParams
from mainspring.engine.sequence import Sequence


def mk(tokens: list[int], salt: str | None = None, rid: str = "r") -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams(max_tokens=16), cache_salt=salt)


def admit(bm: BlockManager, tokens: list[int], salt: str | None = None) -> Sequence:
    """Allocate and pretend the whole sequence was computed."""
    seq = mk(tokens, salt)
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    seq.num_computed_tokens = seq.num_tokens
    bm.mark_computed(seq, seq.num_tokens)
    return seq


def refs(bm: BlockManager, seq: Sequence) -> list[int]:
    return [bm.blocks[b].ref_count for b in seq.block_table]


def test_allocate_and_deallocate_fresh_blocks():
    bm = BlockManager(10, 4)
    seq = mk(list(range(10)))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert refs(bm, seq) == [1, 1, 1]
    assert bm.num_free_blocks == 7
    assert bm.usage == pytest.approx(0.3)
    assert (seq.num_cached_tokens, seq.num_computed_tokens, seq.usage_cached_tokens) == (0, 0, 0)
    with pytest.raises(RuntimeError):
        bm.allocate(seq)  # already holds blocks
    bm.deallocate(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 10
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_shared_prefix_hits_full_blocks_and_bumps_ref_counts():
    bm = BlockManager(10, 4)
    a = admit(bm, list(range(10)))  # blocks [0..3] [4..7] full, [8, 9] partial
    assert bm.num_cached_blocks == 2
    b = mk(list(range(8)) + [50, 51, 52, 53])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2]
    assert b.block_table[2] not in a.block_table
    assert refs(bm, a) == [2, 2, 1]
    assert (b.num_cached_tokens, b.num_computed_tokens, b.usage_cached_tokens) == (8, 8, 8)
    bm.deallocate(a)
    assert refs(bm, b) == [1, 1, 1]
    assert bm.num_free_blocks == 10 - 3


def test_only_full_blocks_are_hits():
    bm = BlockManager(10, 4)
    admit(bm, [1, 2, 3, 4, 5, 6])  # second block partial: never registered
    assert bm.num_cached_blocks == 1
    b = mk([1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(b)
    assert b.num_cached_tokens == 4


def test_last_token_is_never_a_hit():
    bm = BlockManager(10, 4)
    a = admit(bm, list(range(8)))
    same = mk(list(range(8)))
    bm.allocate(same)
    # Block 2 holds the last token: recomputed in a fresh block, never written into a shared one.
    assert same.num_cached_tokens == 4
    assert same.block_table[0] == a.block_table[0] and same.block_table[1] != a.block_table[1]
    longer = mk(list(range(9)))
    bm.allocate(longer)
    assert longer.num_cached_tokens == 8


def test_chain_hash_depends_on_parent_and_salt():
    t = [1, 2, 3, 4]
    root = hash_block_tokens(None, t)
    assert hash_block_tokens(None, t) == root
    assert hash_block_tokens(root, t) != root
    assert hash_block_tokens(b"x" * 32, t) != hash_block_tokens(b"y" * 32, t)
    assert hash_block_tokens(None, t, "a") != hash_block_tokens(None, t, "b") != root
    assert hash_block_tokens(None, t, "") != root
    # Same second block after a different first block: no hit.
    bm = BlockManager(10, 4)
    admit(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = mk([9, 9, 9, 9, 5, 6, 7, 8, 9])
    bm.allocate(b)
    assert b.num_cached_tokens == 0


def test_collision_guard_no_false_hit(monkeypatch):
    monkeypatch.setattr(kv_cache, "hash_block_tokens", lambda *args, **kw: b"collide")
    bm = BlockManager(10, 4)
    admit(bm, [1, 2, 3, 4, 5])
    other = mk([7, 7, 7, 7, 5])
    bm.allocate(other)
    assert other.num_cached_tokens == 0  # hash equal, tokens differ
    salted = mk([1, 2, 3, 4, 5], salt="tenant")
    bm.allocate(salted)
    assert salted.num_cached_tokens == 0  # hash and tokens equal, salt differs
    same = mk([1, 2, 3, 4, 5])
    bm.allocate(same)
    assert same.num_cached_tokens == 4


def test_cache_salt_isolates_tenants():
    bm = BlockManager(20, 4)
    admit(bm, list(range(9)), salt="t1")
    for salt, expected in (("t2", 0), (None, 0), ("t1", 8)):
        s = mk(list(range(9)), salt=salt)
        bm.allocate(s)
        assert s.num_cached_tokens == expected, salt


def test_freed_blocks_stay_hittable_until_reused():
    bm = BlockManager(6, 4)
    a = admit(bm, list(range(9)))
    first_two = a.block_table[:2]
    bm.deallocate(a)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2  # free, yet cached
    b = mk(list(range(8)) + [99])
    assert bm.num_blocks_to_allocate(b) == 3  # 2 free hits come out of the pool + 1 fresh
    bm.allocate(b)
    assert b.block_table[:2] == first_two and b.num_cached_tokens == 8
    assert bm.num_free_blocks == 3
    assert refs(bm, b) == [1, 1, 1]


def test_lru_evicts_deepest_blocks_first():
    bm = BlockManager(6, 4)
    a = admit(bm, list(range(17)))  # 4 full blocks + 1 partial; block 5 never used
    deep = a.block_table[2:4]
    bm.deallocate(a)
    # Needs 4 fresh blocks: the never-hittable partial and the unused block go first, then
    # A's deepest full blocks (freed first because deallocate walks the table in reverse).
    c = admit(bm, [100 + i for i in range(13)])
    assert set(deep) <= set(c.block_table)
    assert bm.num_cached_blocks == 2 + 3
    bm.deallocate(c)
    d = mk(list(range(12)) + [7])
    bm.allocate(d)
    assert d.num_cached_tokens == 8  # the shallow prefix survived


def test_eviction_removes_hash_entry():
    bm = BlockManager(2, 4)
    a = admit(bm, [1, 2, 3, 4, 5])
    bm.deallocate(a)
    admit(bm, [9, 9, 9, 9, 9, 9, 9, 9])  # needs both blocks: evicts A's cached block
    assert all(b.token_ids != (1, 2, 3, 4) for b in bm.blocks)
    fresh = mk([1, 2, 3, 4, 5])
    assert bm.cached_prefix(fresh) == []


def test_mark_computed_registers_generated_token_blocks():
    bm = BlockManager(10, 4)
    seq = mk([1, 2, 3, 4, 5])
    bm.allocate(seq)
    seq.num_computed_tokens = 5
    bm.mark_computed(seq, 5)
    assert bm.num_cached_blocks == 1
    for tok in (60, 61, 62, 63):  # decode: append, make a slot, compute the previous token
        seq.append_token(tok)
        bm.may_append(seq)
        seq.num_computed_tokens = seq.num_tokens - 1
        bm.mark_computed(seq, seq.num_computed_tokens)
    # token 8 (= 62) computed: block [5, 60, 61, 62] is full and mixes prompt and output.
    assert seq.token_ids == [1, 2, 3, 4, 5, 60, 61, 62, 63]
    assert bm.num_cached_blocks == 2
    other = mk([1, 2, 3, 4, 5, 60, 61, 62, 0])
    bm.allocate(other)
    assert other.num_cached_tokens == 8
    assert other.block_table[:2] == seq.block_table[:2]


def test_duplicate_blocks_coexist_without_swapping_tables():
    bm = BlockManager(10, 4)
    a, b = mk([1, 2, 3, 4, 5]), mk([1, 2, 3, 4, 5])
    bm.allocate(a)
    bm.allocate(b)  # nothing computed yet: no hit, each gets its own copy
    assert a.block_table[0] != b.block_table[0]
    tables = (list(a.block_table), list(b.block_table))
    for s in (a, b):
        bm.mark_computed(s, 5)
    assert (a.block_table, b.block_table) == tables
    assert bm.num_cached_blocks == 1
    c = mk([1, 2, 3, 4, 9])
    bm.allocate(c)
    assert c.block_table[0] == a.block_table[0]
    # The unregistered duplicate is useless as cache: it is the first block handed out again.
    bm.deallocate(b)
    d = mk([8, 8] * 4)
    bm.allocate(d)
    assert set(d.block_table) == set(tables[1])  # b's duplicate and partial, before older free blocks


def test_can_allocate_accounts_for_hits():
    bm = BlockManager(4, 4)
    a = admit(bm, list(range(12)))  # 3 blocks in use, 1 free
    b = mk(list(range(8)) + [50, 51, 52])  # 3 blocks, 2 of them hits on blocks A holds
    assert bm.num_blocks_to_allocate(b) == 1
    assert bm.can_allocate(b)
    c = mk(list(range(8)) + [50, 51, 52])
    bm.allocate(b)
    assert bm.num_free_blocks == 0
    assert not bm.can_allocate(c)  # its third block needs a fresh one
    bm.deallocate(a)
    bm.deallocate(b)
    # All free now; A's blocks are ref-0 hits that still come out of the pool.
    big = mk(list(range(12)) + [7, 7, 7, 7, 7])  # 5 blocks > 4
    assert not bm.can_allocate(big)
    ok = mk(list(range(12)) + [7, 7, 7, 7])  # 3 hits + 1 fresh = 4
    assert bm.num_blocks_to_allocate(ok) == 4 and bm.can_allocate(ok)
    bm.allocate(ok)
    assert ok.num_cached_tokens == 12 and bm.num_free_blocks == 0


def test_can_append_and_may_append():
    bm = BlockManager(2, 4)
    seq = mk(list(range(8)))
    bm.allocate(seq)
    assert bm.can_append(seq)
    bm.may_append(seq)  # a slot exists for position 7 already
    assert len(seq.block_table) == 2
    seq.append_token(8)
    assert not bm.can_append(seq)
    with pytest.raises(RuntimeError):
        bm.may_append(seq)
    bm2 = BlockManager(3, 4)
    s2 = mk(list(range(8)))
    bm2.allocate(s2)
    s2.append_token(8)
    assert bm2.can_append(s2)
    bm2.may_append(s2)
    assert len(s2.block_table) == 3 and bm2.num_free_blocks == 0


def test_slot_mapping():
    bm = BlockManager(8, 4)
    bm.allocate(mk([0] * 6))  # occupy blocks so the next table is not [0, 1]
    seq = mk(list(range(6)))
    bm.allocate(seq)
    t = seq.block_table
    assert bm.slot(seq, 0) == t[0] * 4
    assert bm.slot(seq, 5) == t[1] * 4 + 1
    assert bm.slot_mapping(seq, 3, 6) == [t[0] * 4 + 3, t[1] * 4, t[1] * 4 + 1]


def test_prefix_caching_disabled():
    bm = BlockManager(10, 4, enable_prefix_caching=False)
    admit(bm, list(range(9)))
    assert bm.num_cached_blocks == 0 and all(b.hash is None for b in bm.blocks)
    b = mk(list(range(9)))
    bm.allocate(b)
    assert b.num_cached_tokens == 0
    assert bm.stats().prefix_cache_queries == 0


def test_reset_prefix_cache_and_stats():
    bm = BlockManager(10, 4)
    a = admit(bm, list(range(9)))
    b = mk(list(range(9)))
    bm.allocate(b)
    st = bm.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (18, 8)
    assert st.prefix_cache_hit_rate == pytest.approx(8 / 18)
    assert st.num_cached_blocks == 2 and st.num_free_blocks == 10 - 4
    assert st.usage == pytest.approx(0.4)
    assert not bm.reset_prefix_cache()  # blocks in use
    bm.deallocate(a)
    bm.deallocate(b)
    assert bm.reset_prefix_cache()
    c = mk(list(range(9)))
    bm.allocate(c)
    assert c.num_cached_tokens == 0 and bm.num_cached_blocks == 0


def test_usage_cached_tokens_set_only_on_first_admission():
    bm = BlockManager(10, 4)
    seq = mk(list(range(9)))
    bm.allocate(seq)
    seq.num_computed_tokens = 9
    bm.mark_computed(seq, 9)
    bm.deallocate(seq)  # preempted
    assert seq.num_computed_tokens == 0 and seq.num_cached_tokens == 0
    bm.allocate(seq)
    assert seq.num_cached_tokens == 8 and seq.usage_cached_tokens == 0


def test_invalid_sizes():
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError):
        BlockManager(4, 0)
