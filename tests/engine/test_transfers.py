"""A step's uploads do not make the host wait, and its read-back waits once for all it reads (on the simulated GPU
where no GPU is lent: tests/simulated_cuda/ counts the waits); on the CPU neither copies anything."""

import pytest
import torch

from mainspring.engine.transfers import download, upload


def test_on_the_cpu_nothing_is_copied():
    t = torch.arange(4)
    assert upload(t, torch.device("cpu")) is t
    assert upload([1, 2], torch.device("cpu"), torch.long).dtype == torch.long
    a, b = download(t, t * 2)
    assert a is t and b.tolist() == [0, 2, 4, 6]


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests/engine/test_cuda.py counts the waits on a real GPU")
def test_uploads_do_not_wait_and_a_download_waits_once():
    from tests.simulated_cuda import SimulatedCuda

    with SimulatedCuda() as sim, torch.inference_mode():
        dev = torch.device("cuda")
        ids, scales = upload([3, 1, 2], dev, torch.long), upload(torch.tensor([0.5, 2.0]), dev)
        assert ids.is_cuda and scales.is_cuda and sim.total_syncs == 0 and sum(sim.uploads.values()) == 2
        picked, total = download(ids * 2, scales.sum())
        assert sim.total_syncs == 1 and not picked.is_cuda
        assert picked.tolist() == [6, 2, 4] and total.item() == 2.5
