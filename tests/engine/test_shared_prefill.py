"""An int4 layer's prefill rows on another engine's linear over the same weight: shared only where the weight is
exactly the same, run for prefill-sized calls only, and dropped once the shared weights are written."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mainspring.engine.quant as quant
from mainspring.engine.linear_kernel import PackedLinear, mkl_available, onednn_available
from mainspring.engine.quant import KERNEL_MAX_ROWS, Int4Linear, dequantize_int4, quantize_int4, quantize_model
from mainspring.engine.shared_prefill import share_linear

PREFILL_ROWS = KERNEL_MAX_ROWS + 9


@pytest.fixture(autouse=True)
def fp32_copies(monkeypatch):
    """Dense copies in fp32 whatever the CPU (with native bf16 they would be bf16, and an fp32 linear is no match)."""
    monkeypatch.setattr(quant, "native_bf16", lambda: False)
    monkeypatch.setattr(quant, "default_compute_dtype", lambda: torch.float32)


def on_grid(out: int = 64, inp: int = 128, seed: int = 0) -> torch.Tensor:
    """A weight int4 g32 holds exactly, built as GGUF Q4_1 blocks are (fp16 scale and min per 32 weights, each
    block spanning its codes 0..15), the format of the embedded model's layers."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out, inp), generator=gen)
    codes[:, ::32], codes[:, 1::32] = 0, 15
    scale = (torch.rand(out, inp // 32, 1, generator=gen) * 0.01 + 1e-3).half().float()
    low = (torch.randn(out, inp // 32, 1, generator=gen) * 0.05).half().float()
    return (codes.reshape(out, inp // 32, 32).float() * scale + low).reshape(out, inp)


def dense_kinds() -> list[str]:
    return ["torch"] + [k for k, ok in (("onednn", onednn_available()), ("mkl", mkl_available())) if ok]


def dense(weight: torch.Tensor, kind: str, bias: torch.Tensor | None = None) -> nn.Module:
    if kind == "torch":
        lin = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None).requires_grad_(False)
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
        return lin
    return PackedLinear(weight, bias, kernel=kind)


@pytest.mark.parametrize("kind", dense_kinds())
def test_prefill_rows_run_the_shared_linear_and_decode_rows_the_int4_kernel(kind):
    w, b = on_grid(), torch.randn(64)
    other = dense(w, kind, b)
    q = quantize_int4(w, 32)
    share = share_linear({"layer": other}, "layer", w, lambda: dequantize_int4(q), b, torch.float32)
    assert share is not None
    lin = Int4Linear(q, b, dense_prefill=True, shared=share)
    assert lin.dense_weight is None and lin.dense_packed is None  # no copy of its own
    x = torch.randn(PREFILL_ROWS, 128)
    assert torch.equal(lin(x), other(x))
    small = x[:KERNEL_MAX_ROWS]
    assert torch.equal(lin(small), Int4Linear(q, b, dense_prefill=False)(small))


def test_only_an_exact_same_weight_is_shared():
    w = on_grid()
    q = quantize_int4(w, 32)
    dq = lambda: dequantize_int4(q)  # noqa: E731
    assert share_linear({"layer": dense(w + 1e-3, "torch")}, "layer", w, dq, None, torch.float32) is None  # probe
    off_grid = torch.randn(64, 128)  # its int4 form is not the weight: the int4 layer computes another one
    assert share_linear({"layer": dense(off_grid, "torch")}, "layer", off_grid,
                        lambda: dequantize_int4(quantize_int4(off_grid, 32)), None, torch.float32) is None
    assert share_linear({"layer": dense(w, "torch")}, "layer", w, dq, None, torch.bfloat16) is None  # dtype
    assert share_linear({"layer": dense(w, "torch", torch.ones(64))}, "layer", w, dq, None, torch.float32) is None
    assert share_linear({"other": dense(w, "torch")}, "layer", w, dq, None, torch.float32) is None  # name
    assert share_linear({"layer": nn.ReLU()}, "layer", w, dq, None, torch.float32) is None


@pytest.mark.parametrize("kind", dense_kinds())
def test_written_shared_weights_send_prefill_back_to_the_int4_kernel(kind, caplog):
    w = on_grid()
    other = dense(w, kind)
    q = quantize_int4(w, 32)
    lin = Int4Linear(q, dense_prefill=True, shared=share_linear({"l": other}, "l", w, lambda: dequantize_int4(q), None,
                                                                torch.float32))
    x = torch.randn(PREFILL_ROWS, 128)
    assert torch.equal(lin(x), other(x))
    new = on_grid(seed=1)
    if isinstance(other, PackedLinear):
        other.set_weight(new)  # a trainer's sync repacks
    else:
        with torch.no_grad():
            other.weight.copy_(new)  # or writes in place
    got = lin(x)
    assert "written since" in caplog.text
    assert not torch.allclose(got, other(x), atol=1e-3)
    want = Int4Linear(q, dense_prefill=False)(x)  # the -fast engine's own weights, on its kernel
    assert torch.equal(got, want)


def test_quantize_model_shares_where_it_can_and_reports_it():
    from tests.engine.test_quant import tiny_model

    model, standard = tiny_model(), tiny_model()
    with torch.no_grad():  # on the int4 grid, as the embedded model's layers are
        for (name, m), other in zip(model.named_modules(), standard.modules()):
            if isinstance(m, nn.Linear) and m.out_features % 16 == 0 and name != "lm_head":
                m.weight.copy_(on_grid(*m.weight.shape))
                other.weight.copy_(m.weight)
    shared = dict(standard.named_modules())
    report, _ = quantize_model(model, 32, dense_prefill=True, shared=shared)
    assert report.shared_prefill and set(report.shared_prefill) <= set(report.quantized)
    for name in report.shared_prefill:
        layer = model.get_submodule(name)
        assert layer.shared.module is shared[name] and layer.dense_weight is None and layer.dense_packed is None
    # no dense copies asked for: nothing shared either (the int4 kernel runs every call)
    report, _ = quantize_model(tiny_model(), 32, dense_prefill=False, shared=shared)
    assert report.shared_prefill == []
