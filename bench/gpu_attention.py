"""One layer's paged attention on a GPU, four ways, at the embedded model's head shape (9 query heads over 3 KV
heads of 64): what the engine runs, torch's FlashAttention varlen kernel (`torch.nn.attention.varlen`) and
FlexAttention over the paged cache, the candidates to measure before choosing another kernel (issue 23: "SDPA,
FlexAttention or a Triton kernel — measure and choose").

  agent prefill   10 chunks of 50 new tokens, each over a cached 1,504-token system prompt (workload c's steps)
  long prefill    one 512-token chunk over 1,536 cached tokens (a chunked prefill of a long prompt)
  decode          32 rows, 1,504 shared + 51 own tokens each (workload c's decode steps)

  per-chunk  each chunk on its own (gather its context, SDPA with its causal mask): the engine before batching
  engine     what the engine runs on this device: off the CPU, prefill chunks padded into one SDPA call
             (engine/batched_prefill.py); decode rows on the cascade path (the shared prefix gathered once)
  varlen     contexts gathered into one packed tensor, FlashAttention varlen (causal, bottom-right aligned),
             no padding and no mask (CUDA, bf16/fp16 only; its paged form, block_table, needs pages of 256 tokens
             in upstream FlashAttention 2 and 16 in some newer builds: whether torch's takes our 16 is not checked)
  flex       FlexAttention (compiled) reading the cache in place, no gather: one batch entry per row, a block mask
             from the block tables with the cache block (16 tokens) as its KV block, so the Triton kernel's KV tile
             is 16 wide; its first call per case compiles (tens of seconds, not timed)

Times are medians of CUDA-event-timed calls after a warm-up, per layer, metadata on the device already; every
method's output is compared with per-chunk's. On the CPU it runs per-chunk and padded only (a smoke run), and
flex with --flex (compiled by inductor's CPU backend: a check of its block mask, ~20 s).

    python bench/gpu_attention.py [--device cuda] [--dtype bf16] [--flex] [--out bench/results/gpu_attention.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from mainspring.engine.attention import AttentionMetadata, paged_attention
from mainspring.engine.batched_prefill import batch_prefills

H, KVH, D, BS = 9, 3, 64, 16
CASES = {  # prefixes of whole blocks, as the prefix cache shares them
    "agent prefill": dict(prefix=1504, chunks=[50] * 10, decode=0),
    "long prefill": dict(prefix=1536, chunks=[512], decode=0),
    "decode": dict(prefix=1504, chunks=[], decode=32, own=50),
}


def build(case: dict, device: torch.device, dtype: torch.dtype, g: torch.Generator):
    """The case's metadata (on the device), q/k/v for its rows and a cache holding its context."""
    prefix_blocks = case["prefix"] // BS
    shared = list(range(prefix_blocks))  # every row's prefix: the same blocks, as the prefix cache hands out
    next_block, tables = prefix_blocks, []
    rows = case["chunks"] or [case["own"] + 1] * case["decode"]
    for n in rows:
        own = -(-n // BS)
        tables.append(shared + list(range(next_block, next_block + own)))
        next_block += own
    if case["decode"]:
        meta = AttentionMetadata.build([(t, case["prefix"] + case["own"] + 1) for t in tables], [], BS)
    else:
        meta = AttentionMetadata.build([], [(t, case["prefix"], n) for t, n in zip(tables, case["chunks"])], BS)
    k_cache, v_cache = (torch.randn(next_block * BS, KVH, D, generator=g).to(device, dtype) for _ in range(2))
    n = meta.slot_mapping.numel()
    q = torch.randn(n, H, D, generator=g).to(device, dtype)
    k, v = (torch.randn(n, KVH, D, generator=g).to(device, dtype) for _ in range(2))
    return meta, q, k, v, k_cache, v_cache, tables


def row_lengths(case: dict) -> tuple[list[int], list[int]]:
    """Each row's new tokens (queries) and the tokens it attends (its context, the new ones included)."""
    if case["decode"]:
        return [1] * case["decode"], [case["prefix"] + case["own"] + 1] * case["decode"]
    return case["chunks"], [case["prefix"] + n for n in case["chunks"]]


def varlen(meta: AttentionMetadata, q, k_cache, v_cache, tables, case, scale: float):
    """The same rows through FlashAttention varlen: each row's context gathered into one packed K/V."""
    from torch.nn.attention.varlen import varlen_attn

    from mainspring.engine import kv_slots

    lens_q, lens_k = row_lengths(case)
    slots = torch.cat([kv_slots.slots(t, n, BS) for t, n in zip(tables, lens_k)]).to(q.device)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device=q.device)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device=q.device)

    def run():
        kp, vp = torch.index_select(k_cache, 0, slots), torch.index_select(v_cache, 0, slots)
        return varlen_attn(q, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), scale=scale, window_size=(-1, 0),
                           enable_gqa=True)

    return run


def flex_paged(q, k_cache, v_cache, tables, case, scale: float):
    """The same rows through FlexAttention straight over the paged cache, as torch's experimental PagedAttention
    does it: one batch entry per row (chunks padded to the longest), K/V the whole cache as one batch of 1, and a
    block mask built from the block tables (sparse KV blocks of one cache block; blocks every query of a 128-query
    tile sees whole need no mask, the rest are masked causally through the row's physical-to-logical map)."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    device, q_tile = q.device, 128
    lens_q, ctx = row_lengths(case)
    rows, longest, num_blocks = len(lens_q), max(lens_q), k_cache.shape[0] // BS
    tiles = -(-longest // q_tile)
    full: list[list[list[int]]] = [[[] for _ in range(tiles)] for _ in range(rows)]
    partial: list[list[list[int]]] = [[[] for _ in range(tiles)] for _ in range(rows)]
    logical = torch.full((rows, num_blocks), -1, dtype=torch.int32)
    for r, (table, n, c) in enumerate(zip(tables, lens_q, ctx)):
        logical[r, table] = torch.arange(len(table), dtype=torch.int32)
        for t in range(tiles):
            first, end = c - n + t * q_tile, min(c - n + (t + 1) * q_tile, c)  # the tile's query positions
            for j in range(-(-end // BS) if first < c else 0):
                (full if (j + 1) * BS - 1 <= first else partial)[r][t].append(table[j])

    def packed(lists):  # as wide as the cache: the q-block transpose densifies over every block id
        counts = torch.tensor([[len(x) for x in row] for row in lists], dtype=torch.int32)
        indices = torch.tensor([[x + [0] * (num_blocks - len(x)) for x in row] for row in lists], dtype=torch.int32)
        return counts[:, None], indices[:, None]  # [rows, 1 (heads), tiles(, width)]

    start = torch.tensor([c - n for n, c in zip(lens_q, ctx)], device=device)
    logical = logical.to(device)

    def causal(b, h, q_idx, kv_idx):  # whole by itself (eager flex reads only this, not the block lists)
        block = logical[b, kv_idx // BS]
        return (block >= 0) & (block * BS + kv_idx % BS <= start[b] + q_idx)

    (kv_num, kv_idx), (full_num, full_idx) = packed(partial), packed(full)
    mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(q_tile, BS), mask_mod=causal,
                                    seq_lengths=(longest, k_cache.shape[0])).to(device)  # built on the host
    # where each packed query row goes in the padded [rows, longest] grid
    dest = torch.cat([r * longest + torch.arange(n) for r, n in enumerate(lens_q)]).to(device)
    k, v = (c.unsqueeze(0).transpose(1, 2) for c in (k_cache, v_cache))  # [1, KVH, slots, D]: a view
    # compiled on the CPU too: eager flex reads only the mask function, the compiled kernels also the block lists
    attend = torch.compile(flex_attention, dynamic=False)
    # the Triton kernels' KV tile must divide the sparse block (one cache block, 16 tokens)
    options = {"BLOCK_N": BS} if device.type == "cuda" and longest >= q_tile else None

    def run():
        grid = q.new_zeros(rows * longest, H, D).index_copy_(0, dest, q).view(rows, longest, H, D).transpose(1, 2)
        out = attend(grid, k, v, block_mask=mask, scale=scale, enable_gqa=True, kernel_options=options)
        return out.transpose(1, 2).reshape(rows * longest, H, D).index_select(0, dest)

    return run


def timed(fn, device: torch.device, iters: int = 50) -> float:
    """Median ms per call."""
    for _ in range(5):
        fn()
    out = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def measure_case(case: dict, device: torch.device, dtype: torch.dtype, g: torch.Generator, scale: float,
                 flex: bool = False) -> dict:
    meta, q, k, v, k_cache, v_cache, tables = build(case, device, dtype, g)
    engine = meta.to(device)
    metas = {"per-chunk": dataclasses.replace(engine, batched=None, shared=None), "engine": engine}
    if device.type == "cpu" and not case["decode"]:  # the padded path, built off the CPU only, for comparison
        metas["padded"] = dataclasses.replace(meta, shared=None, batched=batch_prefills(meta.prefills,
                                                                                         meta.slot_mapping))
    methods = {name: partial(paged_attention, q, k, v, (k_cache, v_cache), m, scale) for name, m in metas.items()}
    if device.type == "cuda" and dtype != torch.float32 and importlib.util.find_spec("torch.nn.attention.varlen"):
        methods["varlen"] = varlen(meta, q, k_cache, v_cache, tables, case, scale)  # torch 2.10 and later
    if device.type == "cuda" or flex:  # on the CPU only when asked: a check of its block mask (compiling: ~20 s)
        methods["flex"] = flex_paged(q, k_cache, v_cache, tables, case, scale)
    ref = methods["per-chunk"]().float()
    row = {}
    for method, fn in methods.items():
        try:
            got = fn().float()
        except Exception as exc:  # a kernel this build or GPU lacks, a compile that fails: say so, measure the rest
            row[method] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            continue
        rows = slice(0, got.shape[0])  # varlen returns the same rows in the same order
        row[method] = {"ms": round(timed(fn, device), 4),
                       "max_abs_diff_vs_per_chunk": round((got - ref[rows]).abs().max().item(), 5)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "gpu_attention.json"))
    ap.add_argument("--flex", action="store_true", help="on the CPU too: compiled flex, a block-mask check")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    scale, g = D**-0.5, torch.Generator().manual_seed(0)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "dtype": args.dtype, "torch": torch.__version__, "cases": {}}
    for name, case in CASES.items():
        row = measure_case(case, device, dtype, g, scale, args.flex)
        report["cases"][name] = row
        print(name, json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
