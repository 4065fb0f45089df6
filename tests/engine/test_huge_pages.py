"""Weights moved onto huge pages: every dense tensor lands in the one advised mapping with its values, shape,
strides and ties intact, the model's logits are bit for bit the same (dense, int4 and oneDNN-packed linears), and
where huge pages cannot be asked for nothing moves. Whether the kernel then backs the mapping with 2 MiB pages is
the host's business (its THP setting): the tests check what the code controls."""


import pytest
import torch
from torch import nn

from mainspring.engine import huge_pages
from mainspring.engine.huge_pages import place_weights
from mainspring.engine.linear_kernel import PackedLinear, mkl_available, onednn_available, pack_linears
from mainspring.engine.model import CausalLM
from mainspring.engine.quant import quantize_model
from tests.engine.test_quant import run_logits, tiny_model
from tests.train.tiny import tiny_config, tiny_state

needs_thp = pytest.mark.skipif(bool(huge_pages.unavailable()),
                               reason=f"huge pages cannot be asked for here: {huge_pages.unavailable()}")


def dense_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for m in model.modules() for t in [*m._parameters.values(), *m._buffers.values()]
            if t is not None and not t.is_mkldnn]


def in_one_mapping(tensors: list[torch.Tensor]) -> bool:
    """Every tensor's bytes lie inside one advised mapping."""
    mappings = {huge_pages.placed_in(t.data_ptr()) for t in tensors}
    if len(mappings) != 1 or None in mappings:
        return False
    (lo, hi), = mappings
    return all(lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi for t in tensors)


@needs_thp
def test_dense_weights_move_with_values_ties_and_logits_intact():
    cfg = tiny_config()
    model = CausalLM.from_weights(cfg, tiny_state(cfg))
    ids = list(range(20))
    before = run_logits(model, ids)
    values = {name: t.clone() for name, t in model.state_dict().items()}
    embed = model.embed_tokens.weight
    assert model.lm_head.weight is embed  # tied
    report = place_weights(model)
    assert not report.reason
    tensors = dense_tensors(model)
    assert report.placed_bytes == sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())
    assert in_one_mapping(tensors)
    assert model.embed_tokens.weight is embed and model.lm_head.weight is embed  # the same Parameter, still tied
    for name, t in model.state_dict().items():
        assert torch.equal(t, values[name]), name
    assert torch.equal(run_logits(model, ids), before)
    assert 0 <= report.huge_bytes <= report.placed_bytes
    again = place_weights(model)  # already placed: nothing moves
    assert again.placed_bytes == report.placed_bytes and model.embed_tokens.weight.data_ptr() == embed.data_ptr()


@needs_thp
def test_views_and_shared_buffers_keep_their_layout():
    class Holder(nn.Module):
        def __init__(self, base: torch.Tensor, shared: torch.Tensor) -> None:
            super().__init__()
            self.w = nn.Parameter(base[1:, ::2], requires_grad=False)  # a strided view into a bigger storage
            self.register_buffer("table", shared)

    base, shared = torch.arange(600, dtype=torch.float32).view(20, 30), torch.arange(7, dtype=torch.int64)
    model = nn.Sequential(Holder(base, shared), Holder(base, shared))
    expect_w, expect_table = base[1:, ::2].clone(), shared.clone()
    stride, offset = model[0].w.stride(), model[0].w.storage_offset()
    report = place_weights(model)
    assert report.placed_bytes > 0 and in_one_mapping([h.w for h in model] + [h.table for h in model])
    for h in model:
        assert torch.equal(h.w, expect_w) and torch.equal(h.table, expect_table)
        assert h.w.stride() == stride and h.w.storage_offset() > offset  # same view, now into the arena
    # one copy of each storage: both holders still view the same memory
    assert model[0].w.data_ptr() == model[1].w.data_ptr()
    assert model[0].table.data_ptr() == model[1].table.data_ptr()
    assert base.data_ptr() != model[0].w.untyped_storage().data_ptr()  # the caller's tensor was not touched
    assert torch.equal(base, torch.arange(600, dtype=torch.float32).view(20, 30))


@needs_thp
def test_int4_model_moves_and_decodes_the_same():
    model = tiny_model()
    quantize_model(model, group_size=32)
    ids = list(range(12))
    before = run_logits(model, ids)
    report = place_weights(model)
    assert report.placed_bytes > 0 and in_one_mapping(dense_tensors(model))
    assert torch.equal(run_logits(model, ids), before)


@needs_thp
@pytest.mark.skipif(not onednn_available(), reason="this torch build has no working oneDNN linear")
def test_packed_linears_are_collapsed_in_place_and_compute_the_same():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(*(nn.Linear(1024, 1024, bias=False) for _ in range(2))).requires_grad_(False)
    for layer in model:
        layer.weight.copy_(torch.randn(1024, 1024, generator=g) * 0.03)
    pack_linears(model)
    assert all(isinstance(m, PackedLinear) for m in model)
    x = torch.randn(3, 1024, generator=g)
    before = model(x)
    report = place_weights(model)
    assert report.placed_bytes == 0  # no dense tensor: the packed weights are opaque and stay where they are
    assert torch.equal(model(x), before)
    assert 0 <= report.collapsed_pages <= 2 * (4 << 20) // huge_pages.huge_page_size() + 2  # best effort


def test_nothing_moves_where_huge_pages_cannot_be_asked_for(monkeypatch, tmp_path):
    off = tmp_path / "enabled"
    off.write_text("always madvise [never]\n")
    monkeypatch.setattr(huge_pages, "THP_ENABLED", str(off))
    model = tiny_model()
    ptr = model.embed_tokens.weight.data_ptr()
    report = place_weights(model)
    assert report.reason == "transparent huge pages are off ([never])" and report.placed_bytes == 0
    assert model.embed_tokens.weight.data_ptr() == ptr
    assert "4 KiB pages" in report.describe()
    monkeypatch.setattr(huge_pages, "THP_ENABLED", str(tmp_path / "missing"))
    assert place_weights(model).reason == "the kernel has no transparent huge pages"
    monkeypatch.setattr(huge_pages, "THP_SIZE", str(tmp_path / "missing"))
    assert huge_pages.huge_page_size() == 2 << 20  # the kernel does not say: x86-64's
    size = tmp_path / "hpage_pmd_size"
    size.write_text("536870912\n")  # ARM64 with 64 KiB pages
    monkeypatch.setattr(huge_pages, "THP_SIZE", str(size))
    assert huge_pages.huge_page_size() == 512 << 20
    monkeypatch.setattr(huge_pages.sys, "platform", "darwin")
    assert place_weights(model).reason == "not Linux"


def test_the_setting_reaches_the_engine():
    from mainspring.config import Settings
    from mainspring.engine.config import EngineConfig

    assert EngineConfig.from_settings(Settings(huge_pages=False)).huge_pages is False
    assert EngineConfig.from_settings(Settings()).huge_pages is True


@needs_thp
def test_what_a_model_shares_with_its_state_dict_is_placed_once_and_the_rest_is_left_to_go():
    cfg = tiny_config()
    state = tiny_state(cfg)
    ids = list(range(10))
    reference = run_logits(CausalLM.from_weights(cfg, dict(state)), ids)
    fused_away = {n: state[n].data_ptr() for n in state if any(p in n for p in ("q_proj", "gate_proj"))}
    a = CausalLM.from_weights(cfg, state)
    report = place_weights(a, state)
    embed = state["model.embed_tokens.weight"]
    assert a.embed_tokens.weight.data_ptr() == embed.data_ptr()  # the state dict's entry follows the model's copy
    assert huge_pages.placed_in(embed.data_ptr()) is not None
    for name, ptr in fused_away.items():  # fused into qkv / gate_up: not copied, freed with the state dict
        assert state[name].data_ptr() == ptr and huge_pages.placed_in(ptr) is None, name
    assert report.placed_bytes == sum(t.numel() * t.element_size()
                                      for t in {t.data_ptr(): t for t in dense_tensors(a)}.values())
    b = CausalLM.from_weights(cfg, state)  # the -fast engine's model, built next from the same load
    assert b.embed_tokens.weight.data_ptr() == embed.data_ptr()
    mapping = huge_pages.placed_in(embed.data_ptr())
    place_weights(b, state)  # moves what b made (its own fused q/k/v, gate/up), not what it shares with a
    assert b.embed_tokens.weight.data_ptr() == embed.data_ptr() and huge_pages.placed_in(embed.data_ptr()) == mapping
    for model in (a, b):
        assert torch.equal(run_logits(model, ids), reference)


# run in a fresh process: in a long one, MKL may hand out a pack buffer that earlier packs left resident (its memory
# pool, glibc's heap), and then more of it is filled before the pack writes a byte
_COLLAPSE_PROBE = """
import json, torch
from torch import nn
from mainspring.engine import huge_pages
from mainspring.engine.huge_pages import place_weights
from mainspring.engine.linear_kernel import pack_linears
g = torch.Generator().manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 2048, bias=False)).requires_grad_(False)
model[0].weight.copy_(torch.randn(2048, 1024, generator=g) * 0.03)
pack_linears(model, kernel="mkl")
x = torch.randn(5, 1024, generator=g)
before = model(x)
report = place_weights(model)
print(json.dumps({"same": torch.equal(model(x), before), "buffer": torch.ops.mkldnn._nbytes(model[0]._packed),
                  "page": huge_pages.huge_page_size(), "collapsing": report.collapsing_pages,
                  "collapsed": report.collapsed_pages}))
"""


@pytest.mark.skipif(not mkl_available(), reason="this torch build has no MKL packed linear (x86 only)")
def test_mkl_packs_are_collapsed_only_where_filled():
    # MKL's pack buffer is larger than what it fills (1.7x on an AMD EPYC, 2-3x on Intel Xeons): a collapse over the
    # empty part would fill it (RSS for nothing)
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _COLLAPSE_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["same"]
    filled = 2048 * 1024 * 4  # 8 MiB packed into a buffer of ~14-24
    page = got["page"]
    assert got["buffer"] - filled > 2 * page  # more left empty than the bound below allows to be collapsed
    assert got["collapsing"] * page <= filled + 2 * page  # not the ~10-16 MiB the pack never filled
    assert 0 <= got["collapsed"] <= got["collapsing"]  # best effort: the kernel may refuse some


@needs_thp
def test_the_mapping_goes_with_the_last_tensor_that_views_it():
    import gc

    model = tiny_model()
    place_weights(model)
    mapping = huge_pages.placed_in(model.embed_tokens.weight.data_ptr())
    assert mapping is not None and mapping[0] in huge_pages._live
    keep = model.norm.weight  # one tensor outliving the model holds the whole mapping
    del model
    gc.collect()
    assert mapping[0] in huge_pages._live
    del keep
    gc.collect()
    assert mapping[0] not in huge_pages._live  # unmapped: an engine rebuilt (a fine-tuned model swapped) leaks nothing
