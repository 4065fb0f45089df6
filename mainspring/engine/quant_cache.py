"""Quantized weights cached on disk, so a model is quantized once per (weights, settings, torch).

The cache stores the portable `Int4Weight` form (codes, scales, mins) in one safetensors file; the
kernel's packed layout is rebuilt at load time because it depends on the CPU. The file name is
keyed on the source weights' identity (path, size and mtime of config.json and every *.safetensors
file: cheap to compute at every start, like the GGUF conversion cache), the group size, which
linears are quantized and how (LM head or not, two passes), the format version and torch's
version. A missing, stale or unreadable file is simply recomputed and rewritten (atomically, so
concurrent starts cannot see half a file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from mainspring.engine.quant import DEFAULT_GROUP_SIZE, DEFAULT_TWO_PASS, Int4Weight, QuantReport, quantize_model

log = logging.getLogger(__name__)

CACHE_FORMAT = "mainspring-int4/1"
# "int4": activations in bf16 where the kernel vectorises them (native bf16, or x86 with AVX2), else fp32
# (quant.default_compute_dtype);
# "int4-bf16" / "int4-fp32" pin them; "int8": int8 weights and dynamically quantized activations;
# "bf16": bf16 weights on oneDNN (engine/linear_kernel.py)
QUANTIZATION_METHODS = ("int4", "int4-bf16", "int4-fp32", "int8", "bf16")
_INT4_COMPUTE = {"int4": None, "int4-bf16": torch.bfloat16, "int4-fp32": torch.float32}


def source_identity(source_dir: Path) -> str:
    """A fingerprint of a HF folder's weights and config that changes whenever any file does."""
    source_dir = Path(source_dir).resolve()
    files = sorted([*source_dir.glob("*.safetensors"), source_dir / "config.json"])
    parts = [str(source_dir)]
    for f in files:
        if f.is_file():
            st = f.stat()
            parts.append(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def quant_cache_file(cache_dir: Path, source_dir: Path, group_size: int, include_lm_head: bool = True,
                     two_pass: tuple[str, ...] = DEFAULT_TWO_PASS) -> Path:
    policy = f"{group_size}\0{include_lm_head}\0{','.join(sorted(two_pass))}"
    key = hashlib.sha256(
        f"{CACHE_FORMAT}\0{torch.__version__}\0{policy}\0{source_identity(source_dir)}".encode()
    ).hexdigest()[:16]
    head = "" if include_lm_head else "-nohead"
    return Path(cache_dir) / "quant" / f"{Path(source_dir).name}-int4-g{group_size}{head}-{key}.safetensors"


def save_int4_weights(path: Path, forms: dict[str, Int4Weight], group_size: int) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, q in forms.items():
        tensors |= {f"{name}.codes": q.codes, f"{name}.scales": q.scales, f"{name}.mins": q.mins}
    meta = {"format": CACHE_FORMAT, "group_size": str(group_size), "torch": torch.__version__,
            "modules": json.dumps({name: q.passes for name, q in sorted(forms.items())})}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the other cached files are world-readable too
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_int4_weights(path: Path, group_size: int) -> dict[str, Int4Weight] | None:
    """The cached forms, or None when the file is missing or not a cache of this format / group."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != CACHE_FORMAT or meta.get("group_size") != str(group_size):
            log.warning("int4 cache %s: format %r group %r; re-quantizing", path, meta.get("format"),
                        meta.get("group_size"))
            return None
        tensors = load_file(str(path))
        return {name: Int4Weight(tensors[f"{name}.codes"], tensors[f"{name}.scales"], tensors[f"{name}.mins"],
                                 group_size, int(passes))
                for name, passes in json.loads(meta["modules"]).items()}
    except (OSError, SafetensorError, KeyError, ValueError, AttributeError, TypeError) as e:
        log.warning("int4 cache %s is unreadable (%s); re-quantizing", path, e)
        return None


def quantize_with_cache(model: nn.Module, source_dir: Path | None, cache_dir: Path | None,
                        group_size: int = DEFAULT_GROUP_SIZE, include_lm_head: bool = True,
                        two_pass: tuple[str, ...] = DEFAULT_TWO_PASS,
                        compute_dtype: torch.dtype | None = None, dense_prefill: bool | None = None,
                        shared: Mapping[str, nn.Module] | None = None, device: torch.device | None = None,
                        ) -> QuantReport:
    """`quantize_model`, taking the int4 forms from the disk cache when there is one and writing
    it when there was not. `source_dir` None (weights not from a folder) means no caching."""
    start = time.perf_counter()
    path = None
    cached = None
    if source_dir is not None and cache_dir is not None:
        path = quant_cache_file(cache_dir, source_dir, group_size, include_lm_head, two_pass)
        cached = load_int4_weights(path, group_size)
    report, forms = quantize_model(model, group_size, include_lm_head, two_pass, weights=cached,
                                   compute_dtype=compute_dtype, dense_prefill=dense_prefill, shared=shared,
                                   device=device)
    report.cache_file = str(path) if path else None
    report.from_cache = cached is not None and report.num_quantized_now == 0
    if path is not None and report.num_quantized_now:
        try:
            save_int4_weights(path, forms, group_size)
        except OSError as e:  # a read-only or full cache costs the next start a re-quantization, no more
            log.warning("int4 cache %s could not be written (%s); the next start quantizes again", path, e)
    report.seconds = time.perf_counter() - start
    log.info("int4 g%d: %d linears quantized (%s), %d kept fp32, %d run prefill on the standard engine's linears, "
             "%.2f s", group_size, len(report.quantized), "from cache" if report.from_cache else "computed",
             len(report.kept_fp32), len(report.shared_prefill), report.seconds)
    return report


def quantize_for_engine(model: nn.Module, source_dir: Path | None, method: str | None,
                        group_size: int = DEFAULT_GROUP_SIZE, cache_dir: Path | None = None,
                        dense_prefill: bool | None = None,
                        shared: Mapping[str, nn.Module] | None = None,
                        device: torch.device | None = None) -> QuantReport | None:
    """What `EngineConfig.quantization` asks for: None leaves the model fp32; an int4 method
    quantizes it (cached under `cache_dir`, default get_settings().cache_dir; `dense_prefill`, `shared` and `device`:
    see quant.Int4Linear and quant.quantize_model); "int8" and "bf16" need no cache and run on the CPU only."""
    if not method:
        return None
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {method!r}; supported: {', '.join(QUANTIZATION_METHODS)} "
                         "(or none for fp32 weights)")
    if method == "bf16":
        from mainspring.engine.linear_kernel import quantize_model_bf16

        report = quantize_model_bf16(model)
        log.info("bf16: %d linears packed for oneDNN, %.2f s", len(report.quantized), report.seconds)
        return report
    if method == "int8":
        from mainspring.engine.quant_int8 import available, quantize_model_int8

        if not available():
            raise ValueError("quantization 'int8' needs torch's quantized CPU engine (fbgemm/onednn/qnnpack), "
                             "which this torch build lacks")
        report = quantize_model_int8(model)
        log.info("int8: %d linears quantized, %.2f s", len(report.quantized), report.seconds)
        return report
    if cache_dir is None:
        from mainspring.config import get_settings

        cache_dir = get_settings().cache_dir
    return quantize_with_cache(model, source_dir, cache_dir, group_size, compute_dtype=_INT4_COMPUTE[method],
                               dense_prefill=dense_prefill, shared=shared, device=device)
