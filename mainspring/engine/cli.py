"""`mainspring perplexity FILE`: how well the model predicts a text under a KV policy.

The way to check a long-context setting before serving it: a sliding window with and without
sinks, a cold tier at int8 / int4, SnapKV-free dense attention as the reference (`--compare`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional, TypedDict

import typer
from rich.console import Console
from rich.table import Table

from mainspring.console import fail

err = Console(stderr=True)


class ScoredRun(TypedDict):
    """One row of the table (and of --json's "runs")."""

    policy: str
    tokens: int
    ppl: float
    peak_kv_mb: float
    seconds: float


_FLAGS = {"attention_window": "--window", "attention_sinks": "--sinks", "kv_hot_tokens": "--hot"}


def perplexity_cmd(
    file: Path = typer.Argument(..., help="a UTF-8 text file"),
    window: Optional[int] = typer.Option(None, "--window", help="attend to the last N tokens (+ sinks)"),
    sinks: int = typer.Option(4, "--sinks", help="attention sinks kept with a window"),
    hot: Optional[int] = typer.Option(None, "--hot", help="keep the last N tokens fp32, quantize older blocks"),
    bits: int = typer.Option(8, "--bits", help="cold tier precision with --hot: 8 or 4"),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="score only the first N tokens"),
    chunk: int = typer.Option(256, "--chunk", help="tokens per forward pass"),
    compare: bool = typer.Option(False, "--compare", help="also score with dense fp32 attention (within the context)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Perplexity of FILE under a KV policy, through the engine's own KV path."""
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.errors import EngineError
    from mainspring.engine.kv_policy import KVPolicy, KVPolicyConfig
    from mainspring.engine.perplexity import perplexity

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{file}: cannot read it as UTF-8 text ({exc})")
    if bits not in (4, 8):
        fail("--bits must be 8 or 4")
    if chunk < 1:
        fail("--chunk must be at least 1")
    with err.status("loading model"):
        try:
            engine = LLMEngine.from_settings(kv_policy=KVPolicyConfig(cold_bits=bits) if hot else None)
        except EngineError as exc:
            fail(str(exc))
    ids = engine.tokenizer.encode(text)[:tokens]
    if len(ids) < 2:
        fail(f"{file}: fewer than two tokens to score")
    runs: list[tuple[str, KVPolicy | None, list[int]]] = []
    try:
        policy = None if window is None and hot is None else \
            KVPolicy(window=window, sink_tokens=sinks, hot_tokens=hot).validate(engine.config.block_size)
        if compare and policy is not None:
            runs.append(("dense fp32", None, ids[: engine.max_model_len]))
        if policy is None and len(ids) > engine.max_model_len:
            fail(f"the text has {len(ids)} tokens, more than the model's context ({engine.max_model_len}); "
                  "give --window to go past it, or --tokens to score less")
        name = "dense fp32" if policy is None else ", ".join(
            p for p in (f"window {window} + {sinks} sinks" if window else "",
                        f"hot {hot}, int{bits} cold" if hot else "") if p)
        runs.append((name, policy, ids))
        rows: list[ScoredRun] = []
        for name, pol, part in runs:
            start = time.perf_counter()
            result = perplexity(engine, part, pol, chunk=chunk, progress=not as_json)
            rows.append({"policy": name, "tokens": len(part), "ppl": round(result.ppl(), 4),
                         "peak_kv_mb": round(result.kv_bytes_peak / 2**20, 1),
                         "seconds": round(time.perf_counter() - start, 1)})
    except EngineError as exc:  # name the flags, not the request fields they stand for
        msg = str(exc)
        for field, flag in _FLAGS.items():
            msg = msg.replace(field, flag)
        fail(msg)
    except RuntimeError as exc:  # the KV pool cannot hold the text densely
        fail(str(exc))
    if as_json:
        print(json.dumps({"model": engine.name, "file": str(file), "runs": rows}))
        return
    table = Table(title=f"{engine.name} on {file.name}")
    for col in ("policy", "tokens", "ppl", "peak KV MB", "seconds"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["policy"], f"{r['tokens']:,}", f"{r['ppl']:.3f}", str(r["peak_kv_mb"]), str(r["seconds"]))
    Console().print(table)
