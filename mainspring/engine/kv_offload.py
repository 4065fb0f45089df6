"""Second KV tier: full prefix-cache blocks on local disk, keyed by their chained block hash, so
an evicted block is reloaded instead of recomputed and the prefix cache survives a restart. Files
live in root/<fingerprint digest>/<block hash hex>: another model, quantization or layout never
sees them.

Format: a 64-byte header (magic+version, block hash, the four dims, CRC32 of the payload), then K
and V as raw native (little-endian) values in the hot cache's dtype (float32, bfloat16 or float16: the
fingerprint names it, so a directory holds one dtype), [2, layers, block_size, kv_heads, head_dim]. Raw
bytes, not safetensors: the header proves a file is whole and is this hash's (bad magic, size,
hash, dims or CRC: delete and miss), which safetensors cannot (no checksum, no room for the hash
but string metadata), and a read stays one readinto() viewed as that dtype without a copy. The CRC is
also why there is no fsync: a crash that loses a renamed file's data leaves a short or zeroed
file, which the checks reject. Measured on one 737 KB block: CRC ~0.2 ms, the rest ~0.1-0.2 ms.

Concurrency: one engine thread per instance; processes may share a directory. Writes go to a
temp file there and are os.replace()d in, so readers see a whole file or none. The in-memory
index (what `in` answers) is this process's view and may be stale; get() always asks the disk,
so a block another process evicted is a miss and one it wrote is a hit. Each process enforces
the capacity over the files it knows of.

DiskKVTier binds a cache to one engine's hot pool (kv_cache.BlockManager.disk): a registered block
is written when the allocator evicts it, and every registered block at a clean shutdown
(LLMEngine.flush_kv_cache); a crash keeps only what was evicted or flushed before it.

capacity_mb=0 is read-only: put() is a no-op and nothing is evicted, but get() still serves what
is there (a warm cache shipped with a deployment, or a directory another process fills).
"""

from __future__ import annotations

import logging
import os
import struct
import tempfile
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path

import torch

from mainspring.engine.quant_cache import source_identity

log = logging.getLogger(__name__)

FORMAT = "mainspring-kv/1"
_MAGIC = b"MSKV\x00\x00\x00\x01"
_HEADER = struct.Struct("<8s32s4II")  # magic, block hash, L, block_size, KVH, D, crc32 of the payload
_HEADER_LEN = 64  # padded so the float32 payload is aligned
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 3600.0  # a temp file this old belongs to a writer that died


@dataclass(frozen=True)
class DiskKVStats:
    hits: int
    misses: int
    puts: int
    evictions: int
    corrupt: int  # bad files found (and deleted) by get()
    num_blocks: int  # in this process's index
    nbytes: int


DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _bytes_of(t: torch.Tensor) -> memoryview:
    """A view of a contiguous CPU tensor's memory (no copy; as bytes, which numpy has for bfloat16 too)."""
    flat = t.reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())  # type: ignore[arg-type]  # numpy's stubs declare __buffer__ on Python >= 3.12


def model_fingerprint(model_path: str | Path, block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                      dtype: str = "float32", *, variant: str = "") -> str:
    """Identity of the KV a model computes: its weights (path, size and mtime of the GGUF file, or
    of config.json and every *.safetensors in a HF folder, as the int4 cache keys them) plus the
    block layout. `variant` is whatever else changes the KV values, e.g. "int4-g64" quantization."""
    p = Path(model_path).resolve()
    if p.is_dir():
        weights = source_identity(p)
    else:
        st = p.stat()  # FileNotFoundError for a missing path: a path alone is no identity
        weights = sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    return (f"{FORMAT} weights={weights} block_size={block_size} layers={num_layers} kv_heads={num_kv_heads} "
            f"head_dim={head_dim} dtype={dtype} variant={variant}")


class DiskKVCache:
    """Full KV blocks on disk, keyed by their prefix-cache hash; survives restarts."""

    def __init__(self, root: Path, fingerprint: str, capacity_mb: int,
                 block_shape: tuple[int, int, int, int] | None = None, verify: bool = True,
                 dtype: torch.dtype = torch.float32) -> None:
        """`block_shape` (layers, block_size, kv_heads, head_dim), when given, is checked on put
        and get; without it a file need only be self-consistent. `verify=False` skips the CRC on
        get (about 3/4 of a warm read's time) and keeps only the header and size checks. `dtype`: the
        blocks' (put must give it; name it in the fingerprint too, see model_fingerprint)."""
        if capacity_mb < 0:
            raise ValueError(f"capacity_mb must be >= 0, got {capacity_mb}")
        if dtype not in DTYPES:
            raise ValueError(f"KV disk blocks are float32, bfloat16 or float16, not {dtype}")
        self.dtype = dtype
        self.dir = Path(root) / sha256(fingerprint.encode()).hexdigest()[:32]
        self.fingerprint = fingerprint
        self.capacity_bytes = capacity_mb * 1024 * 1024
        self.block_shape = tuple(block_shape) if block_shape is not None else None
        self.verify = verify
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file size, least recent first
        self._nbytes = 0
        self._last_ns = 0
        self._hits = self._misses = self._puts = self._evictions = self._corrupt = 0
        self._warned_write = False
        if self.capacity_bytes:
            self.dir.mkdir(parents=True, exist_ok=True)
            label = self.dir / "fingerprint.txt"  # for whoever looks at the directory; never read back
            if not label.exists():
                self._write_atomic(label, [fingerprint.encode() + b"\n"])
        self._scan()
        self._evict()

    def _scan(self) -> None:
        found: list[tuple[int, str, int]] = []
        now = time.time()
        try:
            entries = list(os.scandir(self.dir))
        except FileNotFoundError:
            return
        for e in entries:
            try:
                st = e.stat()
                if e.name.startswith(_TMP_PREFIX):
                    if now - st.st_mtime > _STALE_TMP_S and self.capacity_bytes:
                        os.unlink(e.path)
                    continue
                if len(e.name) == 64:
                    found.append((st.st_mtime_ns, e.name, st.st_size))
            except OSError:
                continue
        for _, name, size in sorted(found):  # mtime is last use (see _stamp), so this is LRU order
            try:
                self._add(bytes.fromhex(name), size)
            except ValueError:
                continue

    def _path(self, block_hash: bytes) -> Path:
        return self.dir / block_hash.hex()

    def _stamp(self) -> int:
        """A strictly increasing wall-clock ns, so mtime order is use order even within one tick."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def stats(self) -> DiskKVStats:
        return DiskKVStats(self._hits, self._misses, self._puts, self._evictions, self._corrupt,
                           len(self._index), self._nbytes)

    def put(self, block_hash: bytes, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one block ([layers, block_size, kv_heads, head_dim] each in this cache's dtype, any strides, on
        any device). A write error (disk full, read-only) is logged and dropped: the block is only a cache."""
        if k.shape != v.shape or k.dim() != 4 or k.dtype != self.dtype or v.dtype != self.dtype:
            raise ValueError(f"k/v must be equal-shape 4-d {self.dtype}, got {tuple(k.shape)} {k.dtype}, "
                             f"{tuple(v.shape)} {v.dtype}")
        if self.block_shape is not None and tuple(k.shape) != self.block_shape:
            raise ValueError(f"block shape {tuple(k.shape)} != {self.block_shape}")
        if len(block_hash) != 32:
            raise ValueError(f"block hashes are 32-byte SHA-256 digests, got {len(block_hash)} bytes")
        size = _HEADER_LEN + 2 * k.numel() * self.dtype.itemsize
        if not self.capacity_bytes or size > self.capacity_bytes or block_hash in self._index:
            return
        path = self._path(block_hash)
        if path.exists():  # another process wrote it
            self._add(block_hash, size)
            return
        payload = _bytes_of(torch.stack((k.detach(), v.detach())).cpu().contiguous())
        header = _HEADER.pack(_MAGIC, block_hash, *k.shape, zlib.crc32(payload))
        try:
            self._write_atomic(path, [header.ljust(_HEADER_LEN, b"\0"), payload])
        except OSError as e:
            (log.debug if self._warned_write else log.warning)("KV disk cache %s: write failed (%s)", self.dir, e)
            self._warned_write = True
            return
        self._puts += 1
        self._add(block_hash, size)
        self._evict()

    def _write_atomic(self, path: Path, chunks: list) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    f.write(c)
                f.flush()  # so no later write moves the mtime set here
                os.utime(f.fileno(), ns=(ns := self._stamp(), ns))
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _add(self, block_hash: bytes, size: int) -> None:
        self._index[block_hash] = size
        self._nbytes += size

    def _drop(self, block_hash: bytes) -> None:
        size = self._index.pop(block_hash, None)
        if size is not None:
            self._nbytes -= size

    def _evict(self) -> None:
        while self.capacity_bytes and self._nbytes > self.capacity_bytes and self._index:
            victim = next(iter(self._index))
            self._drop(victim)
            try:
                os.unlink(self._path(victim))
            except FileNotFoundError:
                pass  # another process evicted it first
            except OSError as e:
                log.warning("KV disk cache %s: cannot evict %s (%s)", self.dir, victim.hex(), e)
            self._evictions += 1

    def get(self, block_hash: bytes) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(k, v) of the block, or None if absent. A bad file is deleted and reads as absent."""
        path = self._path(block_hash)
        try:
            with open(path, "rb", buffering=0) as f:
                buf = torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8)  # not zeroed
                n = f.readinto(_bytes_of(buf))
        except FileNotFoundError:
            self._drop(block_hash)
            self._misses += 1
            return None
        except OSError as e:
            log.warning("KV disk cache: cannot read %s (%s)", path, e)
            self._misses += 1
            return None
        kv = self._decode(buf, n, block_hash)
        if kv is None:
            self._corrupt += 1
            self._misses += 1
            log.warning("KV disk cache: %s is corrupt or not a %s block; deleting it", path, FORMAT)
            self._drop(block_hash)
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        self._hits += 1
        if block_hash in self._index:
            self._index.move_to_end(block_hash)
        else:
            self._add(block_hash, n)  # written by another process since we opened
            self._evict()
        try:
            os.utime(path, ns=(ns := self._stamp(), ns))  # recency that survives a restart
        except OSError:
            pass
        return kv

    def _decode(self, buf: torch.Tensor, n: int, block_hash: bytes) -> tuple[torch.Tensor, torch.Tensor] | None:
        raw = _bytes_of(buf)
        if n != len(raw) or n < _HEADER_LEN:
            return None
        magic, h, *dims, crc = _HEADER.unpack_from(raw)
        if magic != _MAGIC or h != block_hash or min(dims) < 1:
            return None
        if self.block_shape is not None and tuple(dims) != self.block_shape:
            return None
        L, bs, kvh, d = dims
        if n != _HEADER_LEN + 2 * L * bs * kvh * d * self.dtype.itemsize:
            return None
        if self.verify and zlib.crc32(raw[_HEADER_LEN:]) != crc:
            return None
        t = buf[_HEADER_LEN:].view(self.dtype).view(2, L, bs, kvh, d)
        return t[0], t[1]


class DiskKVTier:
    """A DiskKVCache bound to one engine's hot KV pool: what the BlockManager calls to spill an
    evicted prefix block (save), to look a block up (`in`: the index only, no file system call)
    and to fill a fresh block from disk (load)."""

    def __init__(self, disk: DiskKVCache, cache: torch.Tensor, block_size: int) -> None:
        self.disk = disk
        self.cache = cache  # the runner's [layers, 2, slots, kv_heads, head_dim]; block b owns its
        self.block_size = block_size  # slots [b * block_size, (b + 1) * block_size)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.disk

    def _slots(self, block_id: int) -> slice:
        return slice(block_id * self.block_size, (block_id + 1) * self.block_size)

    def save(self, block_id: int, block_hash: bytes) -> None:
        if block_hash not in self.disk:  # a block loaded from disk is evicted without a write
            kv = self.cache[:, :, self._slots(block_id)]
            self.disk.put(block_hash, kv[:, 0], kv[:, 1])

    def load(self, block_id: int, block_hash: bytes) -> bool:
        """Copy the block's K/V into `block_id`'s slots (on the cache's device); False (nothing written) if the
        file is gone or bad."""
        kv = self.disk.get(block_hash)
        if kv is None:
            return False
        dst = self.cache[:, :, self._slots(block_id)]
        dst[:, 0].copy_(kv[0])
        dst[:, 1].copy_(kv[1])
        return True

    def flush(self, blocks: list[tuple[int, bytes]]) -> int:
        """Write the (block id, hash) blocks the disk lacks, in order; returns how many it wrote."""
        before = self.disk.stats().puts
        for bid, h in blocks:
            self.save(bid, h)
        return self.disk.stats().puts - before

    def stats(self) -> dict[str, int]:
        s = self.disk.stats()
        return {"kv_disk_blocks": s.num_blocks, "kv_disk_bytes": s.nbytes, "kv_disk_hits": s.hits,
                "kv_disk_misses": s.misses, "kv_disk_writes": s.puts, "kv_disk_evictions": s.evictions,
                "kv_disk_corrupt": s.corrupt}
