"""The simulated GPU (tests/simulated_cuda/) refuses what CUDA refuses and counts what makes the host wait: the
CUDA tests run on it where no GPU is lent, so each rule it enforces is checked here against a program that breaks
it."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.simulated_cuda import DeviceTensor, SimulatedCuda

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is here: tests/engine/test_cuda.py "
                                                                   "runs on it")


@pytest.fixture
def sim():
    with SimulatedCuda() as s, torch.inference_mode():
        yield s
    assert not torch.cuda.is_available()  # taken away again


def test_tensors_on_the_device_say_so_and_compute_on_the_hosts_kernels(sim):
    a = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    b = (a * 2 + 1).to(torch.bfloat16)
    assert isinstance(b, DeviceTensor) and b.is_cuda and b.device == torch.device("cuda", 0)
    assert b.cpu().tolist() == [3.0, 5.0, 7.0] and not isinstance(b.cpu(), DeviceTensor)
    layer = torch.nn.Linear(3, 2).to("cuda")
    assert layer.weight.is_cuda and isinstance(layer.weight, torch.nn.Parameter)
    assert torch.allclose(layer(a).cpu(), layer.weight.cpu() @ a.cpu() + layer.bias.cpu())


def test_mixing_devices_fails_as_on_cuda_except_where_cuda_allows_it(sim):
    a = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a, torch.ones(3)])
    assert (a + torch.tensor(2.0)).is_cuda  # a 0-dim CPU tensor is a scalar
    assert a[torch.tensor([0, 2])].is_cuda  # CPU index tensors are copied over
    with pytest.raises(TypeError, match="numpy"):
        a.numpy()
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    assert torch.rand(2, device="cuda", generator=g).is_cuda
    with pytest.raises(RuntimeError, match="generator"):
        torch.rand(2, device="cuda", generator=torch.Generator().manual_seed(0))


def test_an_op_without_a_cuda_kernel_fails(sim):
    x = torch.ones(1, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="CUDA"):
        torch.ops.aten._weight_int4pack_mm_for_cpu(x, torch.ones(8, 32, dtype=torch.uint8, device="cuda"), 32,
                                                   torch.ones(2, 8, 2, device="cuda"))


def test_what_makes_the_host_wait_is_counted_and_debug_mode_warns(sim):
    a = torch.arange(6, device="cuda")
    sim.reset_counts()
    a.tolist(), int(a[0]), a.nonzero(), a[a > 2]
    torch.tensor([1, 2], device="cuda")  # a blocking upload: torch synchronizes the stream after it
    torch.tensor([1, 2]).to("cuda", non_blocking=True)
    assert sim.total_syncs == 5 and sim.uploads["host-to-device copy"] == 2
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a.sum().item()
            torch.repeat_interleave(a, a, output_size=15)  # a given size: no wait
            torch.repeat_interleave(a, a)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len([w for w in caught if "synchronizing" in str(w.message)]) == 2


def test_a_non_blocking_read_back_is_valid_only_after_a_wait(sim):
    a = torch.arange(4, device="cuda") * 3
    early = a.to("cpu", non_blocking=True)
    with pytest.raises(RuntimeError, match="before the host waited"):
        early.tolist()
    late = a.to("cpu", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert late.tolist() == [0, 3, 6, 9]


def test_a_graph_replays_its_ops_on_the_captured_buffers(sim):
    static_in, w = torch.zeros(3, device="cuda"), torch.randn(3, 3, device="cuda")
    scale = 5.0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (static_in @ w) * scale + 1
    scale = 100.0  # a Python number is baked into the graph: replays ignore this, as on a GPU
    static_in.copy_(torch.tensor([1.0, 2.0, 3.0]), non_blocking=True)
    graph.replay()
    assert torch.allclose(out.cpu(), (torch.tensor([1.0, 2.0, 3.0]) @ w.cpu()) * 5.0 + 1)
    with pytest.raises(RuntimeError, match="capturing"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        static_in.sum().item()
    with pytest.raises(RuntimeError, match="capturing"), torch.cuda.graph(torch.cuda.CUDAGraph()):
        static_in + torch.tensor([1.0, 2.0, 3.0], device="cuda")  # an upload inside a capture


def test_the_emulated_cuda_int4_kernel_computes_what_the_cpu_kernel_does(sim):
    """The emulation's formula, (q - 8) * scale + zero over scales_and_zeros [K/g, N, 2], checked against torch's
    CPU kernel on the same codes: its packing (column 2j in the high nibble) is the one engine/quant.py writes."""
    from mainspring.engine.quant import Int4Linear, quantize_int4

    g = torch.Generator().manual_seed(0)
    q = quantize_int4(torch.randn(64, 256, generator=g) * 0.02, 32, 1)
    x = torch.randn(3, 256, generator=g).to(torch.bfloat16)
    on_cpu = Int4Linear(q, compute_dtype=torch.bfloat16, dense_prefill=False, device="cpu")
    on_gpu = Int4Linear(q, device="cuda")
    assert on_gpu.packed.is_cuda and on_gpu.packed.dtype == torch.int32
    want, got = on_cpu(x).float(), on_gpu(x.to("cuda")).float().cpu()
    assert ((got - want).norm() / want.norm()).item() < 1e-2
    with pytest.raises(RuntimeError, match="bf16"):
        torch.ops.aten._weight_int4pack_mm(x.float().to("cuda"), on_gpu.packed, 32, on_gpu.scales_and_zeros)
