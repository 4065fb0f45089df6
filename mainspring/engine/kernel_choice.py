"""Which weight format the `-fast` engine runs on this CPU: measured at first start, then cached.

The candidates follow the CPU's features (engine/cpu.py): int4 with bf16 activations everywhere (torch's
int4 kernel converts bf16 in software where the CPU lacks it, and its bf16 path is the vectorised one on
AVX2 and AVX-512 alike: under an AVX2 cap on an AMD EPYC, 11.6 ms of linears per step against 29.8 for fp32
and 134.8 with fp32 activations), bf16 weights on oneDNN where bf16 is native, int8 with dynamically
quantized activations where an int8 GEMM backend exists (AVX2 and up, NEON), int4 with fp32 activations,
and fp32 (the standard engine's weights, on its own kernel: engine/linear_kernel.py) as the floor. Each is
timed on the model's own linear shapes at the rows a fast decode step multiplies (1 for a plain
step, k + 1 for a speculative verification) for a few milliseconds per shape, the candidates taking turns three
times and keeping their best (so a burst of other load cannot decide); the fastest one whose
teacher-forced output on a fixed text stays close to fp32 (top-1 agreement and perplexity ratio,
`AccuracyBound`) wins. When fp32 is the fastest left, there is no faster format on this CPU: the
fast variant then serves the standard weights with speculative decoding, and says so.

The choice is stored as JSON under <cache dir>/kernels, keyed by the model, the CPU's feature key
and torch's version, so later starts skip the measurement; the log line and /health carry it.

The standard engine's fp32 linear kernel ("auto" in engine/linear_kernel.py) is cached there too
(`choose_linear_kernel`), keyed by the CPU's feature key, torch's version, the thread count, the dtype and the
shape timed: where two kernels come out close, a fresh measurement at each start could take either (the Xeon
capped at AVX2 flipped between torch's and MKL's from one start to the next), and a server's speed should not
depend on which start it had.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mainspring.engine.cpu import CpuFeatures, detect
from mainspring.engine.linear_kernel import (
    PACKED_KERNELS, PackedLinear, bf16_packing_available, choose, packs, seconds_per_call,
    widest_shape,
)

log = logging.getLogger(__name__)

FP32 = "fp32"
# 2: bf16, fp32 on the engine's kernel; 3: streamed timing; 4: int4-bf16 offered on every CPU (a choice cached
# before it, fp32 on AVX2-only CPUs, is measured again); 5: candidates take turns, best of ROUNDS (a choice one burst
# of load may have decided is measured again)
CHOICE_FORMAT = "mainspring-kernel-choice/5"
LINEAR_CHOICE_FORMAT = "mainspring-linear-kernel/1"
BUDGET_S = 0.02  # timing per (candidate, shape, rows, round); at least one call after a warm-up
ROUNDS = 3  # turns each candidate takes per (shape, rows); its best counts
HOPELESS = 3.0  # a candidate this many times slower than the fastest in the first round takes no more turns
# distinct weight copies per shape, up to this many fp32 bytes: a decode step streams every layer's
# weights from memory, while one matrix timed over and over sits in cache and hides what the
# smaller formats save (on an AMD EPYC: int4-bf16 8.2 vs bf16 7.5 ms in cache, 7.6 vs 11.1 streamed)
STREAM_BYTES = 256 << 20
# A fixed English text (written for this purpose): the accuracy check's teacher-forced input.
REFERENCE_TEXT = (
    "The harbour town woke slowly. Fishing boats came back before sunrise, and the market opened when the "
    "first crates of mackerel reached the quay. By eight o'clock the bakery had sold most of its bread, the "
    "school bus had left for the valley, and the ferry to the island was loading cars. Tourists arrived later, "
    "asking for maps, coffee and the way to the lighthouse, which is a forty minute walk along the cliffs. In "
    "winter the town is quiet: the hotels close, the wind is strong, and most evenings the only lights on the "
    "harbour are the ones on the boats that will go out again the next morning."
)


@dataclass(frozen=True)
class AccuracyBound:
    min_top1: float = 0.90  # share of positions whose most likely next token equals fp32's
    max_ppl_ratio: float = 1.10  # perplexity on the text, against fp32's


@dataclass
class KernelChoice:
    name: str  # a candidate: "int4-bf16" | "bf16" | "int8" | "int4-fp32" | "fp32"
    reason: str
    ms_per_step: dict[str, float] = field(default_factory=dict)  # measured linear time per candidate
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)  # checked candidates: top1, ppl_ratio
    cpu: dict[str, object] = field(default_factory=dict)
    from_cache: bool = False
    measured_s: float = 0.0

    @property
    def quantization(self) -> str | None:
        """The EngineConfig.quantization this choice runs (None: the standard fp32 weights)."""
        return None if self.name == FP32 else self.name

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def candidates(features: CpuFeatures, int8_available: bool, onednn: bool = False) -> list[str]:
    """The formats worth timing on this CPU, fp32 last (`onednn`: torch's oneDNN packs bf16 weights here)."""
    out = ["int4-bf16"]
    if features.bf16 and onednn:
        out.append("bf16")
    if int8_available and features.int8_gemm:
        out.append("int8")
    out.append("int4-fp32")
    return [*out, FP32]


def linear_shapes(model: nn.Module) -> Counter[tuple[int, int]]:
    """How many linears of each [out, in] shape one forward runs (the LM head included)."""
    from mainspring.engine.quant import quantizable_linears

    return Counter(tuple(m.weight.shape) for m in quantizable_linears(model).values())  # type: ignore[misc]


def build_linear(name: str, weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A linear of candidate `name` over `weight` (no bias), as the engine would build it."""
    if name == FP32:  # the standard engine's kernel for this shape: oneDNN or MKL prepacked, or torch's
        kernel = choose("auto", [(weight.shape[0], weight.shape[1])])
        if kernel != "torch":
            return PackedLinear(weight, kernel=kernel)
        return lambda x: F.linear(x, weight)
    if name == "bf16":
        return PackedLinear(weight, dtype=torch.bfloat16)
    if name == "int8":
        from mainspring.engine.quant_int8 import Int8Linear

        return Int8Linear(weight, None)
    from mainspring.engine.quant import DEFAULT_GROUP_SIZE, Int4Linear, quantize_int4

    dtype = torch.bfloat16 if name == "int4-bf16" else torch.float32
    return Int4Linear(quantize_int4(weight, DEFAULT_GROUP_SIZE), None, dtype, dense_prefill=False)


@torch.inference_mode()
def measure(names: Sequence[str], shapes: Counter[tuple[int, int]], rows: Sequence[int],
            budget_s: float = BUDGET_S, rounds: int = ROUNDS) -> dict[str, float]:
    """Milliseconds of linear work per decode step for each candidate: every shape's time per call,
    times how often a forward runs it, averaged over `rows`. Each shape is timed over as many
    distinct weights as a forward has (up to STREAM_BYTES), so the weights stream from memory as in
    a real step. The candidates take turns, `rounds` times, and each keeps its best: a burst of other
    work on the cores then slows every candidate's worst round, not one candidate's only one (measured
    alone, one format's 20 ms could land on a burst and lose: on an AMD EPYC a choice made while tests ran took bf16
    weights at 7.8 ms against int4-bf16's 9.7; on the quiet machine int4-bf16 took 6.4 against 7.6, and its -fast
    engine decoded 260 tok/s against bf16's 209). So every candidate's copies of one shape are held at once: once per
    CPU, at the -fast engine's first start, ~1 GB more at peak for the embedded model's widest shape. Random weights:
    speed does not depend on the values."""
    gen = torch.Generator().manual_seed(0)
    out = dict.fromkeys(names, 0.0)
    for (n, k), count in shapes.items():
        copies = max(1, min(count, STREAM_BYTES // (n * k * 4)))
        weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(copies)]
        xs = [torch.randn(r, k, generator=gen) for r in rows]
        built = {name: [build_linear(name, w) for w in weights] for name in names}
        best = {(name, i): float("inf") for name in names for i in range(len(xs))}
        for r in range(max(1, rounds)):
            for name, fns in built.items():
                if r and best[name, 0] > HOPELESS * min(best[other, 0] for other in names):
                    continue  # no burst of load makes a format this much slower: its first round stands
                for i, x in enumerate(xs):
                    best[name, i] = min(best[name, i], seconds_per_call(fns, x, budget_s))
        for name in names:
            out[name] += sum(best[name, i] for i in range(len(xs))) / len(xs) * count * 1e3
        del built
    return {k: round(v, 4) for k, v in out.items()}


def pick(ms_per_step: dict[str, float], check: Callable[[str], dict[str, float]], bound: AccuracyBound,
         ) -> tuple[str, str, dict[str, dict[str, float]]]:
    """The fastest candidate that meets `bound` (checked lazily, fastest first), why, and what was
    checked. fp32 needs no check: it is the reference."""
    checked: dict[str, dict[str, float]] = {}
    floor = ms_per_step.get(FP32)
    for name in sorted(ms_per_step, key=ms_per_step.__getitem__):
        if name == FP32:
            why = (f"the formats faster than fp32 miss the accuracy bound ({', '.join(checked)})" if checked
                   else "no quantized format is faster than fp32 on this CPU")
            return FP32, why, checked
        acc = checked[name] = check(name)
        if acc["top1"] >= bound.min_top1 and acc["ppl_ratio"] <= bound.max_ppl_ratio:
            gain = f", {floor / ms_per_step[name]:.2f}x fp32's linear time" if floor else ""
            return name, f"fastest within the accuracy bound{gain}", checked
    return FP32, "no candidate met the accuracy bound", checked


def accuracy_check(loaded, threads: int, text: str = REFERENCE_TEXT, chunk: int = 6,
                   ) -> Callable[[str], dict[str, float]]:
    """check(name): top-1 agreement and perplexity ratio of candidate `name` against fp32, teacher-
    forced over `text` in chunks of `chunk` rows (the decode kernels' sizes, not prefill's)."""
    from mainspring.engine.config import EngineConfig
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.perplexity import perplexity

    ids = loaded.tokenizer.encode(text)
    ref_cache: dict[str, object] = {}

    def score(quantization: str | None):
        engine = LLMEngine(loaded, EngineConfig(quantization=quantization, kv_cache_mb=16, max_num_seqs=1,
                                                threads=threads, enable_prefix_caching=False))
        return perplexity(engine, ids, chunk=chunk)

    def check(name: str) -> dict[str, float]:
        if "ref" not in ref_cache:
            ref_cache["ref"] = score(None)
        ref = ref_cache["ref"]
        got = score(name)
        same = sum(a == b for a, b in zip(got.top1, ref.top1)) / max(1, len(ref.top1))  # type: ignore[attr-defined]
        return {"top1": round(same, 4), "ppl_ratio": round(got.ppl() / ref.ppl(), 4)}  # type: ignore[attr-defined]

    return check


def choice_file(cache_dir: Path, loaded, features: CpuFeatures) -> Path:
    from mainspring.engine.quant_cache import source_identity

    source = source_identity(Path(loaded.path))[:12] if loaded.path else "nopath"
    return Path(cache_dir) / "kernels" / f"{loaded.name}-{features.key}-{source}-torch{torch.__version__}.json"


def load_choice(path: Path) -> KernelChoice | None:
    try:
        doc = json.loads(path.read_text())
        if doc.pop("format", None) != CHOICE_FORMAT:
            return None
        return KernelChoice(**{**doc, "from_cache": True})
    except (OSError, ValueError, TypeError):
        return None


def save_choice(path: Path, choice: KernelChoice) -> None:
    _write_json(path, {"format": CHOICE_FORMAT, **choice.to_dict(), "from_cache": False})


def _write_json(path: Path, doc: dict[str, object]) -> None:
    """Whole or not at all: a start that reads the file while another writes it sees the old one or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def linear_kernel_file(cache_dir: Path, shape: tuple[int, int], dtype: torch.dtype, kernels: tuple[str, ...],
                       features: CpuFeatures) -> Path:
    dtype_name = str(dtype).removeprefix("torch.")
    return Path(cache_dir) / "kernels" / (f"linear-{features.key}-torch{torch.__version__}-t{torch.get_num_threads()}"
                                          f"-{dtype_name}-{shape[0]}x{shape[1]}-{'+'.join(kernels)}.json")


def choose_linear_kernel(kernel: str, shapes: list[tuple[int, int]], dtype: torch.dtype = torch.float32,
                         cache_dir: Path | None = None, kernels: tuple[str, ...] = PACKED_KERNELS) -> str:
    """`linear_kernel.choose`, with what "auto" measured kept under `cache_dir` (see the module docstring) and
    taken from there at later starts; a cached kernel this build no longer packs is measured again."""
    if kernel != "auto" or not shapes or cache_dir is None:
        return choose(kernel, shapes, dtype, kernels)
    path = linear_kernel_file(cache_dir, widest_shape(shapes), dtype, kernels, detect())
    try:
        doc = json.loads(path.read_text())
        cached = doc["kernel"] if doc.get("format") == LINEAR_CHOICE_FORMAT else None
    except (OSError, ValueError, TypeError, KeyError):
        cached = None
    if cached == "torch" or (cached in kernels and packs(cached, dtype)):
        log.info("linear kernel %s (measured at an earlier start: %s)", cached, path)
        return cached
    chosen = choose(kernel, shapes, dtype, kernels)
    try:
        _write_json(path, {"format": LINEAR_CHOICE_FORMAT, "kernel": chosen})
    except OSError as e:  # a read-only cache: the next start measures again
        log.warning("linear kernel choice %s could not be written (%s)", path, e)
    return chosen


def choose_kernel(loaded, cache_dir: Path | None, *, threads: int, verify_rows: int,
                  features: CpuFeatures | None = None, bound: AccuracyBound = AccuracyBound(),
                  check: Callable[[str], dict[str, float]] | None = None) -> KernelChoice:
    """The cached choice for this (model, CPU, torch), or a fresh measurement (then cached)."""
    from mainspring.engine.model import CausalLM
    from mainspring.engine.quant_int8 import available

    features = features or detect()
    path = choice_file(cache_dir, loaded, features) if cache_dir is not None else None
    if path is not None and (cached := load_choice(path)) is not None:
        return cached
    start = time.perf_counter()
    names = candidates(features, available(), bf16_packing_available())
    meta = CausalLM.from_weights(loaded.config, loaded.state_dict)  # shapes only; shares the tensors
    ms = measure(names, linear_shapes(meta), rows=(1, verify_rows))
    del meta
    name, reason, checked = pick(ms, check or accuracy_check(loaded, threads), bound)
    choice = KernelChoice(name, reason, ms, checked, features.to_dict(),
                          measured_s=round(time.perf_counter() - start, 2))
    if path is not None:
        try:
            save_choice(path, choice)
        except OSError as e:  # a read-only cache: the next start measures again
            log.warning("kernel choice %s could not be written (%s)", path, e)
    return choice
