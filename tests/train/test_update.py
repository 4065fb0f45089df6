"""The update on a tiny random Llama: the training forward is the engine's forward, token-level loss
is exact under gradient accumulation and under 2-process data parallelism, and gradient surgery
changes the update when domains conflict."""

import math

import pytest
import torch
import torch.multiprocessing as mp

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.model import CausalLM
from mainspring.train.config import TrainConfig
from mainspring.train.domains.base import DomainSettings
from mainspring.train.grpo import policy_loss
from mainspring.train.policy import Policy, dense_forward
from mainspring.train.update import TrainItem, Updater
from tests.train.tiny import tiny_config, tiny_state

CFG = tiny_config()
DOMAINS = {"a": DomainSettings(), "b": DomainSettings()}


def make_items(n: int = 8, seed: int = 1, group: int = 1) -> list[TrainItem]:
    """n completions; `group` consecutive ones share a prompt (GRPO's G samples)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for i in range(n):
        if i % group == 0:
            prompt = torch.randint(0, CFG.vocab_size, (int(torch.randint(3, 7, (1,), generator=g)),),
                                   generator=g).tolist()
        completion = torch.randint(0, CFG.vocab_size, (int(torch.randint(1, 9, (1,), generator=g)),),
                                   generator=g).tolist()  # completions of different lengths
        adv = float(torch.randn(1, generator=g))
        items.append(TrainItem(prompt + completion, len(prompt), adv, "a" if (i // group) % 2 else "b"))
    return items


def config(**kw) -> TrainConfig:
    base = {"domains": [{"name": "a"}, {"name": "b"}], "lora": None, "micro_batch": 8, "interference": "sum",
            "lr": 1e-3}
    return TrainConfig.parse({**base, **kw})


def test_training_forward_is_the_engines_forward():
    sd = tiny_state(CFG)
    ids = torch.randint(0, CFG.vocab_size, (1, 21))
    train = dense_forward(Policy(CFG, sd, None).model, ids)[0]
    engine = CausalLM.from_weights(CFG, sd)
    cache = torch.zeros(CFG.num_hidden_layers, 2, 64, CFG.num_key_value_heads, CFG.head_dim)
    kv = [(cache[i, 0], cache[i, 1]) for i in range(CFG.num_hidden_layers)]
    with torch.inference_mode():
        paged = engine(ids[0], torch.arange(21), kv, AttentionMetadata.build([], [([0, 1], 0, 21)], 16))
    assert torch.allclose(train, paged, atol=1e-5)


def test_entropy_is_the_policys_at_each_completion_position():
    """group_logprobs_and_entropy: the same log-probs as group_logprobs, and at each completion
    token the entropy of the next-token distribution the full-sequence forward gives there."""
    policy = Policy(CFG, tiny_state(CFG), None)
    prompt, comps, lens = torch.tensor([3, 1, 4]), torch.tensor([[5, 9, 2], [6, 5, 0]]), torch.tensor([3, 2])
    with torch.no_grad():
        lp, ent = policy.group_logprobs_and_entropy(prompt, comps, lens)
        assert torch.equal(lp, policy.group_logprobs(prompt, comps, lens))
        for r in range(2):
            ids = torch.cat([prompt, comps[r, :lens[r]]])[None]
            logits = policy.model.compute_logits(dense_forward(policy.model, ids)[0]).float()
            dist = torch.distributions.Categorical(logits=logits[len(prompt) - 1:-1])
            assert torch.allclose(ent[r, :lens[r]], dist.entropy(), atol=1e-5)
    assert ent[1, 2] == 0 and (ent[:, :2] > 0).all() and not ent.requires_grad


def test_update_metrics_report_the_mean_entropy_per_token():
    items = make_items()
    stats = Updater(Policy(CFG, tiny_state(CFG), None), config(updates_per_batch=2), DOMAINS).step(items)
    tokens = sum(len(x.ids) - x.start for x in items)
    assert stats["tokens"] == tokens  # per update: the stats of two updates are averaged, not summed
    assert 0 < stats["entropy_sum"] / tokens <= math.log(CFG.vocab_size) + 1e-6


def reference_gradient(items: list[TrainItem]) -> list[torch.Tensor]:
    """The full batch's token-mean loss in one forward per item, no micro-batching."""
    policy = Policy(CFG, tiny_state(CFG), None)
    total = sum(len(x.ids) - x.start for x in items)
    loss = 0
    for x in items:
        ids = torch.tensor([x.ids])
        lp = policy.token_logprobs(ids, torch.tensor([x.start]), torch.tensor([len(x.ids)]))
        mask = torch.zeros_like(lp)
        mask[0, x.start:] = 1
        loss = loss + policy_loss(lp, lp.detach(), torch.tensor([x.advantage]), mask, total).loss
    loss.backward()
    return [p.grad for p in policy.trainable().values()]


@pytest.mark.parametrize("micro_batch,group", [(1, 1), (3, 1), (8, 1), (1, 4), (3, 4), (8, 4)])
def test_token_level_loss_is_exact_under_gradient_accumulation(micro_batch, group):
    """Micro-batches of 1, 3 or 8 completions, with or without a prompt shared by 4 of them (computed
    once per forward), give the gradient of one full-batch forward of every sequence on its own."""
    items = make_items(group=group)
    want = reference_gradient(items)
    up = Updater(Policy(CFG, tiny_state(CFG), None), config(micro_batch=micro_batch), DOMAINS)
    got = up.gradients(items)["all"]
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-4)


def test_a_sequence_mean_would_differ():
    """Guard against a test that cannot fail: averaging per sequence gives another gradient."""
    items = make_items()
    want = reference_gradient(items)
    policy = Policy(CFG, tiny_state(CFG), None)
    loss = 0
    for x in items:
        n = len(x.ids) - x.start
        ids = torch.tensor([x.ids])
        lp = policy.token_logprobs(ids, torch.tensor([x.start]), torch.tensor([len(x.ids)]))
        mask = torch.zeros_like(lp)
        mask[0, x.start:] = 1
        loss = loss + policy_loss(lp, lp.detach(), torch.tensor([x.advantage]), mask, n).loss / len(items)
    loss.backward()
    assert not all(torch.allclose(p.grad, w, atol=1e-6, rtol=1e-4) for p, w in zip(policy.trainable().values(), want))


def test_per_domain_optimizers_step_each_domain_at_its_own_rate():
    items = make_items()
    slow = {"a": DomainSettings(lr_scale=0.0), "b": DomainSettings()}
    up = Updater(Policy(CFG, tiny_state(CFG), None), config(interference="weights"), slow)
    before = {n: p.detach().clone() for n, p in up.policy.trainable().items()}
    only_b = Updater(Policy(CFG, tiny_state(CFG), None), config(interference="weights"), slow)
    up.step(items)
    only_b.step([x for x in items if x.domain == "b"])  # domain a at lr 0 must change nothing
    changed = False
    for n, p in up.policy.trainable().items():
        assert torch.allclose(p, only_b.policy.trainable()[n], atol=1e-7)
        changed |= not torch.equal(p, before[n])
    assert changed


def test_pcgrad_changes_the_update_on_conflicting_domains():
    # the same sequences in both domains with opposite advantages: the gradients conflict exactly
    base = make_items(4)
    items = [TrainItem(x.ids, x.start, abs(x.advantage) + 0.5, "a") for x in base]
    items += [TrainItem(x.ids, x.start, -0.5 * (abs(x.advantage) + 0.5), "b") for x in base]
    grads = {}
    for mode in ("sum", "pcgrad", "cagrad"):
        up = Updater(Policy(CFG, tiny_state(CFG), None), config(interference=mode), DOMAINS)
        grads[mode] = torch.cat([g.flatten() for g in up.gradients(items)["all"]])
    ga = torch.cat([g.flatten() for g in Updater(Policy(CFG, tiny_state(CFG), None), config(interference="sum"),
                                                  DOMAINS).gradients(items[:4])["all"]])
    cos = torch.nn.functional.cosine_similarity
    assert cos(grads["pcgrad"], grads["sum"], dim=0) < 0.999
    assert not torch.allclose(grads["cagrad"], grads["sum"])
    # b's gradient is exactly -0.5 x a's: PCGrad removes the conflicting component of each,
    # leaving nothing that hurts domain a (the naive sum still points along a, at half the size)
    assert grads["pcgrad"] @ ga >= -1e-6


def _ddp_worker(rank: int, world: int, init: str, out: str, items: list[TrainItem], mode: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        up = Updater(Policy(CFG, tiny_state(CFG), None), config(interference=mode, micro_batch=2), DOMAINS)
        up.step(items[rank::world])
        if rank == 0:
            torch.save({n: p.detach() for n, p in up.policy.trainable().items()}, out)
        dist.barrier()  # neither rank tears its connections down while the other still uses them
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["sum", "weights"])
def test_two_process_data_parallel_equals_one_process(tmp_path, mode):
    items = make_items(8)
    torch.manual_seed(0)
    single = Updater(Policy(CFG, tiny_state(CFG), None), config(interference=mode, micro_batch=2), DOMAINS)
    single.step(items)
    init = f"file://{tmp_path / 'rendezvous'}"
    out = str(tmp_path / "rank0.pt")
    mp.start_processes(_ddp_worker, args=(2, init, out, items, mode), nprocs=2, join=True, start_method="spawn")
    ddp = torch.load(out)
    for n, p in single.policy.trainable().items():
        assert torch.allclose(ddp[n], p.detach(), atol=1e-6), n
