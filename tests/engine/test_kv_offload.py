"""DiskKVCache: the disk tier of the prefix cache (round trip, restart, isolation, LRU, bad files)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from mainspring.engine import kv_offload
from mainspring.engine.kv_cache import hash_block_tokens
from mainspring.engine.kv_offload import DiskKVCache, model_fingerprint

SHAPE = (2, 4, 3, 8)  # layers, block_size, kv_heads, head_dim
BLOCK_BYTES = 64 + 2 * 2 * 4 * 3 * 8 * 4  # header + K and V float32


def h(i: int) -> bytes:
    return hash_block_tokens(None, [i] * 4)


def kv(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)


def mk(tmp_path, fp: str = "fp-a", capacity_mb: int = 1, **kw) -> DiskKVCache:
    return DiskKVCache(tmp_path, fp, capacity_mb, **kw)


def set_cap(c: DiskKVCache, blocks: int) -> None:
    c.capacity_bytes = blocks * BLOCK_BYTES  # MB granularity is too coarse for tiny test blocks


def test_round_trip_bit_identical(tmp_path):
    c = mk(tmp_path, block_shape=SHAPE)
    k, v = kv(0)
    k[0, 0, 0, 0], v[1, 3, 2, 7] = float("nan"), -0.0  # exact bits, not just values
    assert h(1) not in c and c.get(h(1)) is None
    c.put(h(1), k, v)
    assert h(1) in c and len(c) == 1 and c.nbytes == BLOCK_BYTES
    k2, v2 = c.get(h(1))
    assert k2.shape == SHAPE and k2.dtype == torch.float32
    assert torch.equal(k2.view(torch.int32), k.view(torch.int32))
    assert torch.equal(v2.view(torch.int32), v.view(torch.int32))
    c.put(h(1), *kv(9))  # present: no-op, the old block stays
    assert torch.equal(c.get(h(1))[1].view(torch.int32), v.view(torch.int32))
    s = c.stats()
    assert (s.hits, s.misses, s.puts, s.evictions, s.num_blocks) == (2, 1, 1, 0, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_bf16_or_fp16_cache_stores_its_own_dtype_bit_for_bit(tmp_path, dtype):
    c = mk(tmp_path, block_shape=SHAPE, dtype=dtype)
    k, v = (t.to(dtype) for t in kv(0))
    k[0, 0, 0, 0] = float("nan")
    c.put(h(1), k, v)
    assert c.nbytes == 64 + 2 * k.numel() * 2  # two bytes a value, not four
    k2, v2 = c.get(h(1))
    assert k2.dtype == dtype and torch.equal(k2.view(torch.int16), k.view(torch.int16))
    assert torch.equal(v2.view(torch.int16), v.view(torch.int16))
    with pytest.raises(ValueError, match=f"4-d {dtype}"):
        c.put(h(2), *kv(1))  # float32 blocks into a {dtype} cache
    assert mk(tmp_path, block_shape=SHAPE).get(h(1)) is None  # a float32 cache of the same fingerprint: bad size
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        mk(tmp_path, dtype=torch.int8)


def test_non_contiguous_views(tmp_path):
    # as the runner holds them: cache[L, 2, slots, KVH, D]; one block is a strided slice
    L, bs, kvh, d = SHAPE
    cache = torch.randn(L, 2, 3 * bs, kvh, d)
    k, v = cache[:, 0, bs : 2 * bs], cache[:, 1, bs : 2 * bs]
    assert not k.is_contiguous()
    c = mk(tmp_path)
    c.put(h(1), k, v)
    k2, v2 = c.get(h(1))
    assert torch.equal(k2, k) and torch.equal(v2, v)
    cache[:, :, 2 * bs :] = 0  # loading back into another block's slots is a plain copy
    cache[:, 0, 2 * bs :], cache[:, 1, 2 * bs :] = k2, v2
    assert torch.equal(cache[:, :, 2 * bs :], cache[:, :, bs : 2 * bs])


def test_bad_inputs_raise(tmp_path):
    c = mk(tmp_path, block_shape=SHAPE)
    k, v = kv(0)
    with pytest.raises(ValueError):
        c.put(h(1), k, v[:1])
    with pytest.raises(ValueError):
        c.put(h(1), k.half(), v.half())
    with pytest.raises(ValueError):
        c.put(h(1), k[:1], v[:1])  # equal shapes, but not the cache's


def test_survives_restart_and_fingerprint_isolates(tmp_path):
    c = mk(tmp_path)
    for i in range(3):
        c.put(h(i), *kv(i))
    again = mk(tmp_path)
    assert len(again) == 3 and again.nbytes == 3 * BLOCK_BYTES and all(h(i) in again for i in range(3))
    assert torch.equal(again.get(h(2))[0], kv(2)[0])
    other = mk(tmp_path, fp="fp-b")
    assert len(other) == 0 and h(0) not in other and other.get(h(0)) is None
    other.put(h(0), *kv(7))
    assert torch.equal(mk(tmp_path).get(h(0))[0], kv(0)[0])  # neither overwrites the other
    assert torch.equal(mk(tmp_path, fp="fp-b").get(h(0))[0], kv(7)[0])


def test_lru_eviction_by_capacity(tmp_path):
    c = mk(tmp_path)
    set_cap(c, 3)
    for i in range(3):
        c.put(h(i), *kv(i))
    assert c.get(h(0)) is not None  # 0 is now the most recent; 1 is the oldest
    c.put(h(3), *kv(3))
    assert h(1) not in c and not (c.dir / h(1).hex()).exists()
    assert [x in c for x in (h(0), h(2), h(3))] == [True] * 3
    c.put(h(4), *kv(4))
    assert h(2) not in c and len(c) == 3 and c.nbytes == 3 * BLOCK_BYTES
    assert c.stats().evictions == 2


def test_recency_survives_restart_and_smaller_capacity_evicts_at_open(tmp_path):
    big = (4, 16, 4, 300)  # ~0.59 MB a block: 2 MB holds 3, 1 MB holds 1
    blk = [tuple(torch.full(big, float(i)) for _ in "kv") for i in range(3)]
    c = mk(tmp_path, capacity_mb=2)
    for i in range(3):
        c.put(h(i), *blk[i])
    assert len(c) == 3
    c.get(h(0))  # least recently written, most recently used
    again = mk(tmp_path, capacity_mb=2)
    assert list(again._index) == [h(1), h(2), h(0)]  # LRU order from file mtimes
    small = mk(tmp_path, capacity_mb=1)
    assert list(small._index) == [h(0)] and small.stats().evictions == 2
    assert sorted(p.name for p in small.dir.iterdir()) == sorted([h(0).hex(), "fingerprint.txt"])


def test_capacity_zero_is_read_only(tmp_path):
    mk(tmp_path).put(h(1), *kv(1))
    ro = mk(tmp_path, capacity_mb=0)
    ro.put(h(2), *kv(2))
    assert h(2) not in ro and not (ro.dir / h(2).hex()).exists()
    assert torch.equal(ro.get(h(1))[0], kv(1)[0])  # reads still work
    assert mk(tmp_path / "fresh", capacity_mb=0).get(h(1)) is None  # and need no directory


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage", "bitflip", "other_hash", "wrong_shape"])
def test_corrupt_file_is_a_miss_and_removed(tmp_path, caplog, damage):
    c = mk(tmp_path, block_shape=SHAPE)
    c.put(h(1), *kv(1))
    f = c.dir / h(1).hex()
    raw = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        f.write_bytes(b"")
    elif damage == "garbage":
        f.write_bytes(os.urandom(len(raw)))
    elif damage == "bitflip":
        f.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "other_hash":
        c.put(h(2), *kv(2))
        (c.dir / h(2).hex()).replace(f)
    else:  # a self-consistent block of another layout
        f.unlink()
        mk(tmp_path).put(h(1), *(t[:1] for t in kv(1)))
    with caplog.at_level(logging.WARNING, logger="mainspring.engine.kv_offload"):
        assert c.get(h(1)) is None
    assert not f.exists() and h(1) not in c
    assert "corrupt" in caplog.text and c.stats().corrupt == 1
    assert mk(tmp_path).get(h(1)) is None  # still absent, still no exception


def test_file_removed_behind_the_index(tmp_path):
    a, b = mk(tmp_path), mk(tmp_path)  # two processes on one directory
    a.put(h(1), *kv(1))
    assert h(1) not in b and torch.equal(b.get(h(1))[0], kv(1)[0])  # b sees a's write via get
    assert h(1) in b
    os.unlink(a.dir / h(1).hex())  # another process evicted it
    assert h(1) in a and a.get(h(1)) is None and h(1) not in a and a.nbytes == 0
    b.put(h(2), *kv(2))
    os.unlink(b.dir / h(2).hex())
    set_cap(b, 1)
    b.put(h(3), *kv(3))  # evicting an already-gone file is fine
    assert list(b._index) == [h(3)]


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    c = mk(tmp_path)

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kv_offload.os, "replace", boom)
    c.put(h(1), *kv(1))  # logged, not raised: the block is only a cache
    assert h(1) not in c and c.stats().puts == 0
    assert sorted(p.name for p in c.dir.iterdir()) == ["fingerprint.txt"]  # no final file, no temp left
    monkeypatch.undo()
    c.put(h(1), *kv(1))
    assert h(1) in c and mk(tmp_path).get(h(1)) is not None


def test_stale_temp_files_are_ignored_and_cleaned(tmp_path):
    c = mk(tmp_path)
    fresh, old = c.dir / ".tmp-live", c.dir / ".tmp-dead"
    fresh.write_bytes(b"x")
    old.write_bytes(b"x")
    os.utime(old, (0, 0))
    again = mk(tmp_path)
    assert len(again) == 0 and fresh.exists() and not old.exists()


def test_model_fingerprint(tmp_path):
    w = tmp_path / "m.gguf"
    w.write_bytes(b"a" * 10)
    base = model_fingerprint(w, 16, 30, 3, 64)
    assert base == model_fingerprint(str(w), 16, 30, 3, 64)  # stable
    assert base != model_fingerprint(w, 32, 30, 3, 64) != model_fingerprint(w, 16, 30, 3, 64, "bfloat16")
    assert base != model_fingerprint(w, 16, 30, 3, 64, variant="int4-g64")
    st = w.stat()
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = model_fingerprint(w, 16, 30, 3, 64)
    assert touched != base
    w.write_bytes(b"a" * 11)
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert model_fingerprint(w, 16, 30, 3, 64) not in (base, touched)  # size alone changes it
    d = tmp_path / "hf"  # a HF folder: config.json and the *.safetensors
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"b")
    fd = model_fingerprint(d, 16, 30, 3, 64)
    (d / "model.safetensors").write_bytes(b"bb")
    assert model_fingerprint(d, 16, 30, 3, 64) != fd
    with pytest.raises(FileNotFoundError):
        model_fingerprint(tmp_path / "missing", 16, 30, 3, 64)


def test_verify_off_skips_only_the_checksum(tmp_path):
    c = mk(tmp_path, verify=False)
    c.put(h(1), *kv(1))
    f = c.dir / h(1).hex()
    raw = f.read_bytes()
    f.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    assert c.get(h(1)) is not None  # a flipped bit goes unseen without the CRC
    f.write_bytes(raw[:-4])
    assert c.get(h(1)) is None and not f.exists()  # a short file is still caught


def test_unrelated_files_are_ignored(tmp_path):
    c = mk(tmp_path)
    c.put(h(1), *kv(1))
    (c.dir / ("z" * 64)).write_bytes(b"x")  # right length, not hex
    (c.dir / "notes").write_bytes(b"x")
    again = mk(tmp_path)
    assert len(again) == 1 and again.nbytes == BLOCK_BYTES
    with pytest.raises(ValueError):
        again.put(b"short", *kv(2))
