"""The prefix cache's disk tier: evicted blocks spill to disk and are reloaded on reuse, a flushed
cache survives a restart, bad files fall back to computing, tenants stay apart."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mainspring.config import Settings
from mainspring.engine.config import EngineConfig
from mainspring.engine.engine import LLMEngine
from mainspring.engine.kv_cache import BlockManager, hash_block_tokens
from mainspring.engine.params import SamplingParams
from mainspring.engine.sequence import Sequence

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
BS = 16
PROMPT_BLOCKS = (300 - 1) // BS  # full blocks a 300-token prompt can hit (its last token is recomputed)


# ---- BlockManager against a fake tier (no model) ---------------------------------------------------


class FakeTier:
    """Remembers which block a hash was saved from; `broken` hashes fail to load (gone or corrupt)."""

    def __init__(self) -> None:
        self.files: dict[bytes, int] = {}
        self.saved: list[tuple[int, bytes]] = []
        self.loaded: list[tuple[int, bytes]] = []
        self.broken: set[bytes] = set()

    def __contains__(self, h: bytes) -> bool:
        return h in self.files

    def save(self, bid: int, h: bytes) -> None:
        if h not in self.files:
            self.files[h] = bid
            self.saved.append((bid, h))

    def load(self, bid: int, h: bytes) -> bool:
        if h in self.broken:
            del self.files[h]
            return False
        self.loaded.append((bid, h))
        return True


def seq(tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence("r", tokens, GREEDY, cache_salt=salt)


def run(bm: BlockManager, tokens: list[int], salt: str | None = None) -> Sequence:
    """Admit, compute and finish a sequence at the block level."""
    s = seq(tokens, salt)
    bm.allocate(s)
    bm.mark_computed(s, s.num_tokens)
    bm.deallocate(s)
    return s


def hashes(tokens: list[int], bs: int, salt: str | None = None) -> list[bytes]:
    out, parent = [], None
    for i in range(len(tokens) // bs):
        parent = hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs], salt)
        out.append(parent)
    return out


def test_eviction_spills_and_a_miss_reloads():
    bm, tier = BlockManager(4, 4), FakeTier()
    bm.disk = tier
    a = list(range(13))  # 3 full blocks + 1 token
    run(bm, a)
    assert tier.saved == []  # nothing evicted yet
    run(bm, list(range(100, 113)))  # takes every block: a's 3 registered blocks go to disk
    assert {h for _, h in tier.saved} == set(hashes(a, 4))
    assert bm.num_blocks_to_allocate(seq(a)) == 4  # 3 disk hits load into fresh blocks + 1 fresh
    again = seq(a)
    bm.allocate(again)
    assert again.num_cached_tokens == again.usage_cached_tokens == 12 and len(tier.loaded) == 3
    assert [bid for bid, _ in tier.loaded] == again.block_table[:3]
    # loaded blocks are ordinary cached blocks: a second request hits them in memory
    assert bm.cached_prefix(seq(a)) == again.block_table[:3]
    bm.deallocate(again)
    assert bm.num_free_blocks == 4


def test_failed_load_stops_the_chain_and_leaks_nothing():
    bm, tier = BlockManager(8, 4), FakeTier()
    bm.disk = tier
    a = list(range(17))  # 4 full blocks
    run(bm, a)
    tier.files = {h: 0 for h in hashes(a, 4)}
    bm.reset_prefix_cache()  # memory forgets; the disk has all 4
    tier.broken.add(hashes(a, 4)[2])
    s = seq(a)
    bm.allocate(s)
    assert s.num_cached_tokens == 8 and len(s.block_table) == 5  # 2 loaded, the rest fresh
    assert bm.blocks[s.block_table[2]].hash is None
    bm.deallocate(s)
    assert bm.num_free_blocks == 8


def test_memory_hit_after_a_failed_disk_hit_is_given_back():
    bm, tier = BlockManager(8, 4), FakeTier()
    bm.disk = tier
    a = list(range(13))
    run(bm, a)
    h = hashes(a, 4)
    bid1 = bm._cached[h[1]]
    # block 1 leaves memory for the disk; blocks 0 and 2 stay in memory
    del bm._cached[h[1]]
    bm.blocks[bid1]._clear()
    tier.files[h[1]] = bid1
    assert bm._match(seq(a)) == [bm._cached[h[0]], h[1], bm._cached[h[2]]]
    assert bm.cached_prefix(seq(a)) == [bm._cached[h[0]]]  # up to the first disk hit
    tier.broken.add(h[1])
    s = seq(a)
    bm.allocate(s)
    assert s.num_cached_tokens == 4
    assert bm.blocks[bm._cached[h[2]]].ref_count == 0  # pinned, then released: not in s's table
    assert bm._cached[h[2]] not in s.block_table
    bm.deallocate(s)
    assert bm.num_free_blocks == 8


def test_released_policy_blocks_are_spilled_when_evicted():
    bm, tier = BlockManager(6, 4), FakeTier()
    bm.disk = tier
    s = seq(list(range(13)), salt="\x00kv=32,4,None")
    bm.allocate(s)
    bm.mark_computed(s, 12)
    released = s.block_table[1]
    bm.release(s, [1])  # behind a sliding window: -1, hash intact, free
    assert s.block_table[1] == -1
    other = seq(list(range(50, 59)))
    bm.allocate(other)  # 3 blocks: the 2 never used, then the released hashed one
    assert released in other.block_table and tier.saved == [(released, hashes(s.token_ids, 4, s.cache_salt)[1])]


def test_flush_order_is_least_recently_used_first():
    bm, tier = BlockManager(8, 4), FakeTier()
    bm.disk = tier
    old, new = run(bm, list(range(9))), seq(list(range(40, 49)))
    bm.allocate(new)
    bm.mark_computed(new, 8)  # held: written last
    blocks = bm.registered_blocks()
    assert [h for _, h in blocks] == hashes(old.token_ids, 4)[::-1] + hashes(new.token_ids, 4)


# ---- the real engine on the embedded model -------------------------------------------------------------


def engine(embedded, tmp: Path | None, **kw) -> LLMEngine:
    disk = {"kv_disk_cache_mb": 64, "kv_disk_dir": str(tmp)} if tmp is not None else {}
    return LLMEngine(embedded, EngineConfig(**({"kv_cache_mb": 32} | disk | kw)))


def serve(eng: LLMEngine, ids: list[int], salt: str | None = None):
    rid = eng.add_request(ids, GREEDY, cache_salt=salt)
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id == rid and out.finished:
                return out
    raise AssertionError("request never finished")


@pytest.fixture(scope="module")
def prompt(embedded) -> list[int]:
    text = " ".join(f"Item {i}: the {('red', 'blue', 'green')[i % 3]} box holds {i * 7} marbles." for i in range(60))
    ids = embedded.tokenizer.encode(text)[:300]
    assert len(ids) == 300
    return ids


@pytest.fixture(scope="module")
def expected(embedded, prompt) -> list[int]:
    """Greedy tokens with no disk tier, computed from scratch."""
    return serve(engine(embedded, None), prompt).token_ids


@pytest.fixture(scope="module")
def warm(embedded, prompt, expected, tmp_path_factory) -> Path:
    """A disk tier holding the prompt's blocks for tenant "a", written by a flush."""
    d = tmp_path_factory.mktemp("warm")
    a = engine(embedded, d)
    assert serve(a, prompt, "a").token_ids == expected
    assert a.flush_kv_cache() >= PROMPT_BLOCKS
    assert a.flush_kv_cache() == 0  # everything is on disk already
    return d


def copy_of(warm: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(warm, tmp_path / "kv"))


def test_prefix_cache_survives_a_restart(embedded, prompt, expected, warm, tmp_path):
    b = engine(embedded, copy_of(warm, tmp_path))  # a new engine: its memory cache is empty
    out = serve(b, prompt, "a")
    assert out.usage.cached_tokens == PROMPT_BLOCKS * BS
    assert out.token_ids == expected
    s = b.stats()
    assert s["kv_disk_hits"] == PROMPT_BLOCKS and s["kv_disk_misses"] == 0


def test_evicted_prefix_is_reloaded(embedded, prompt, expected, tmp_path):
    eng = engine(embedded, tmp_path, num_blocks=24)  # room for one 300-token request
    assert serve(eng, prompt).token_ids == expected
    other = [t + 1 for t in prompt]
    serve(eng, other)  # evicts most of the prompt's blocks: they are written to disk
    assert eng.stats()["kv_disk_writes"] > 0
    out = serve(eng, prompt)
    assert out.usage.cached_tokens == PROMPT_BLOCKS * BS  # memory hits, then disk hits
    assert eng.stats()["kv_disk_hits"] > 0
    assert out.token_ids == expected


def test_corrupt_file_is_recomputed(embedded, prompt, expected, warm, tmp_path):
    d = copy_of(warm, tmp_path)
    bad = hashes(prompt, BS, "a")[5].hex()
    (path,) = d.glob(f"*/{bad}")
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    b = engine(embedded, d)
    out = serve(b, prompt, "a")
    assert out.usage.cached_tokens == 5 * BS  # blocks 0-4 from disk, the rest computed
    assert out.token_ids == expected
    assert b.stats()["kv_disk_corrupt"] == 1 and not path.exists()


def test_tenants_never_share_disk_blocks(embedded, prompt, expected, warm, tmp_path):
    b = engine(embedded, copy_of(warm, tmp_path))
    for salt in ("b", None):
        out = serve(b, prompt, salt)
        assert out.usage.cached_tokens == 0 and out.token_ids == expected, salt
    assert b.stats()["kv_disk_hits"] == 0
    assert serve(b, prompt, "a").usage.cached_tokens == PROMPT_BLOCKS * BS


def test_a_bf16_engines_blocks_survive_a_restart_and_stay_apart_from_fp32s(embedded, prompt, tmp_path):
    """A bf16 engine spills bf16 blocks (half the bytes of fp32's) under a fingerprint naming the dtype: a new bf16
    engine decodes the same tokens from them, an fp32 engine never reads them."""
    a = engine(embedded, tmp_path, dtype="bf16")
    first = serve(a, prompt)
    assert a.flush_kv_cache() >= PROMPT_BLOCKS and a.kv_disk.disk.dtype == torch.bfloat16
    c = embedded.config
    assert a.kv_disk.disk.nbytes == a.kv_disk.disk.stats().num_blocks * (
        64 + 2 * c.num_hidden_layers * BS * c.num_key_value_heads * c.head_dim * 2)
    b = engine(embedded, tmp_path, dtype="bf16")
    out = serve(b, prompt)
    assert out.usage.cached_tokens == PROMPT_BLOCKS * BS and out.token_ids == first.token_ids
    assert b.stats()["kv_disk_hits"] == PROMPT_BLOCKS
    fp32 = engine(embedded, tmp_path)
    assert fp32.kv_disk.disk.dir != a.kv_disk.disk.dir
    assert serve(fp32, prompt).usage.cached_tokens == 0 and fp32.stats()["kv_disk_hits"] == 0


def test_off_by_default_and_dir_from_settings(embedded, tmp_path, monkeypatch):
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("MAINSPRING_KV_DISK_CACHE_MB", raising=False)
    assert EngineConfig().kv_disk_cache_mb == 0
    kv_dir = Settings().cache_dir / "kv"
    off = engine(embedded, None)
    assert off.kv_disk is None and off.block_manager.disk is None
    assert off.flush_kv_cache() == 0 and not any(k.startswith("kv_disk") for k in off.stats())
    assert not kv_dir.exists()
    on = engine(embedded, None, kv_disk_cache_mb=8)
    assert on.kv_disk.disk.dir.parent == kv_dir and on.kv_disk.disk.dir.is_dir()
    cfg = EngineConfig.from_settings(Settings(kv_disk_cache_mb=8))
    assert (cfg.kv_disk_cache_mb, cfg.kv_disk_dir) == (8, str(kv_dir))
    assert EngineConfig.from_settings(Settings()).kv_disk_cache_mb == 0
