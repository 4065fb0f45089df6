"""Sampler: greedy, temperature, top-k/top-p/min-p, penalties, min_tokens, seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from mainspring.engine.params import SamplingParams
from mainspring.engine.sampler import Sampler
from mainspring.engine.sequence import Sequence
from mainspring.engine.truncation import apply_filters

EOS = 0


def seq(params: SamplingParams, prompt: list[int] | None = None, output: list[int] | None = None) -> Sequence:
    s = Sequence("req", [5, 6, 7] if prompt is None else list(prompt), params)
    s.token_ids += list(output or [])
    return s


def sample_many(logits_row: torch.Tensor, params: SamplingParams, n: int, seed: int = 0) -> list[int]:
    """n draws of one distribution as an n-row batch (unseeded rows: global RNG)."""
    torch.manual_seed(seed)
    return Sampler([EOS])(logits_row.expand(n, -1).clone(), [seq(params) for _ in range(n)]).token_ids


def counts(tokens: list[int], vocab: int) -> list[int]:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).tolist()


def chi_square(observed: list[int], probs: list[float]) -> float:
    n = sum(observed)
    return sum((o - n * p) ** 2 / (n * p) for o, p in zip(observed, probs) if p > 0)


# --- greedy -----------------------------------------------------------------------------------------


def test_greedy_is_argmax_and_leaves_logits_untouched():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 100, generator=g)
    before = logits.clone()
    out = Sampler([EOS])(logits, [seq(SamplingParams(temperature=0.0)) for _ in range(8)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 8
    assert torch.equal(logits, before)


def test_tiny_temperature_is_greedy_and_finite():
    logits = torch.tensor([[1.0, 3.0, 2.9, -1.0]])
    for t in (1e-7, 1e-30):
        assert Sampler()(logits, [seq(SamplingParams(temperature=t))]).token_ids == [1]
    # Just above the greedy cut-off the division must not overflow into NaN.
    big = torch.tensor([[1e4, -1e4, 0.0]])
    assert Sampler()(big, [seq(SamplingParams(temperature=2e-5))]).token_ids == [0]


def test_large_all_greedy_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 49152, generator=g)
    out = Sampler([EOS])(logits, [seq(SamplingParams(temperature=0.0)) for _ in range(64)])
    assert out.token_ids == logits.argmax(-1).tolist()


def test_large_default_batch_samples_valid_tokens():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 49152, generator=g)
    out = Sampler([EOS])(logits, [seq(SamplingParams()) for _ in range(64)])
    assert len(out.token_ids) == 64 and all(0 <= t < 49152 for t in out.token_ids)


def test_mixed_greedy_and_sampled_rows():
    logits = torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [9.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(temperature=0)]
    assert Sampler()(logits, [seq(p) for p in params]).token_ids == [1, 2, 0]


# --- temperature / filters ----------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_temperature_distribution(temperature: float):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    probs = torch.softmax(logits / temperature, -1).tolist()
    tokens = sample_many(logits, SamplingParams(temperature=temperature), 2000)
    # chi-square with 4 degrees of freedom: 18.47 is the 0.1% critical value.
    assert chi_square(counts(tokens, 5), probs) < 18.47


def test_seeded_sequence_distribution():
    # The per-sequence generator path (one row, many steps) must sample the right distribution too.
    logits = torch.tensor([[1.0, 0.0, 0.5, -0.5]])
    sampler, s = Sampler(), seq(SamplingParams(seed=7))
    tokens = [sampler(logits, [s]).token_ids[0] for _ in range(2000)]
    assert chi_square(counts(tokens, 4), torch.softmax(logits[0], -1).tolist()) < 16.27  # 3 dof, 0.1%


def test_top_k_keeps_exactly_the_k_likeliest():
    logits = torch.tensor([0.1, 0.9, 0.3, 0.8, 0.5, 0.0, 0.7, 0.2])
    tokens = sample_many(logits, SamplingParams(top_k=3), 2000)
    assert set(tokens) == {1, 3, 6}
    renorm = torch.softmax(logits[[1, 3, 6]], -1).tolist()
    c = counts(tokens, 8)
    assert chi_square([c[1], c[3], c[6]], renorm) < 13.82  # 2 dof, 0.1%


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert set(sample_many(logits, SamplingParams(top_p=0.7), 1000)) == {0, 1}
    assert set(sample_many(logits, SamplingParams(top_p=0.85), 1000)) == {0, 1, 2}
    assert set(sample_many(logits, SamplingParams(top_p=0.97), 2000)) == {0, 1, 2, 3}


def test_top_p_keeps_at_least_one_token():
    logits = torch.tensor([0.4, 0.35, 0.25]).log()
    assert set(sample_many(logits, SamplingParams(top_p=1e-9), 500)) == {0}
    # Even a single token with less mass than p stays.
    assert set(sample_many(logits, SamplingParams(top_p=0.3), 500)) == {0}


def test_min_p_relative_to_max():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert set(sample_many(logits, SamplingParams(min_p=0.2), 2000)) == {0, 1, 2}  # cut at 0.1
    assert set(sample_many(logits, SamplingParams(min_p=0.7), 500)) == {0}  # cut at 0.35
    assert set(sample_many(logits, SamplingParams(min_p=1.0), 500)) == {0}


def reference_keep(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Straightforward full-sort reference for one row: top-k, renormalize, top-p, then min-p."""
    v = x.clone()
    if 0 < p.top_k < v.numel():
        v[v < v.topk(p.top_k).values[-1]] = float("-inf")
    if p.top_p < 1.0:
        probs = torch.softmax(v.double(), -1)
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]
        drop = torch.zeros_like(v, dtype=torch.bool)
        drop[order] = before >= p.top_p
        drop[order[0]] = False
        v[drop] = float("-inf")
    if p.min_p > 0:
        probs = torch.softmax(v.double(), -1)
        v[probs < p.min_p * probs.max()] = float("-inf")
    return v > float("-inf")


def test_filters_match_full_sort_reference():
    # Vocab large enough that some nuclei exceed the first candidate window (flat rows), in one batch
    # with rows that need no widening and rows that need no filter at all.
    g = torch.Generator().manual_seed(3)
    vocab = 3000
    x = torch.randn(9, vocab, generator=g, dtype=torch.float64).float()
    x[1] *= 0.05  # nearly flat: top_p=0.9 keeps most of the vocab
    x[5] *= 8.0  # peaked
    params = [
        SamplingParams(top_k=40),
        SamplingParams(top_p=0.9),
        SamplingParams(top_p=0.5),
        SamplingParams(top_k=300, top_p=0.8),
        SamplingParams(top_k=5, top_p=0.3, min_p=0.1),
        SamplingParams(top_p=0.95, min_p=0.01),
        SamplingParams(min_p=0.3),
        SamplingParams(),
        SamplingParams(top_k=vocab + 10),  # larger than the vocab: off
    ]
    y = x.clone()
    apply_filters(y, params)
    for i, p in enumerate(params):
        expected = reference_keep(x[i], p)
        assert torch.equal(y[i] > float("-inf"), expected), f"row {i}: {p}"
        assert torch.equal(y[i][expected], x[i][expected])  # kept logits unchanged


@pytest.mark.parametrize("seed", range(8))
def test_filters_match_reference_randomized(seed: int):
    # Mixed scales: peaked rows (nucleus within the first candidates) and flat ones (histogram path).
    g = torch.Generator().manual_seed(100 + seed)
    rows, vocab = 12, 2000
    scales = torch.tensor([0.02, 0.1, 0.3, 1.0, 3.0, 10.0]).repeat(2)[:rows].unsqueeze(1)
    x = torch.randn(rows, vocab, generator=g, dtype=torch.float64).float() * scales
    choice = torch.randint(0, 4, (rows, 3), generator=g).tolist()
    params = [
        SamplingParams(
            top_k=[0, 3, 40, 700][a],
            top_p=[1.0, 0.3, 0.8, 0.97][b],
            min_p=[0.0, 0.0, 0.05, 0.5][c],
        )
        for a, b, c in choice
    ]
    y = x.clone()
    apply_filters(y, params)
    for i, p in enumerate(params):
        assert torch.equal(y[i] > float("-inf"), reference_keep(x[i], p)), f"row {i}: {p}"


def test_filtered_tokens_never_sampled_in_big_vocab():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(1, 5000, generator=g)
    keep = reference_keep(logits[0], SamplingParams(top_k=50, top_p=0.9))
    tokens = sample_many(logits[0], SamplingParams(top_k=50, top_p=0.9), 500)
    assert all(keep[t] for t in tokens)


# --- penalties and min_tokens ---------------------------------------------------------------------


def test_repetition_penalty_formula():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 3.0, 0.5]])
    s = seq(SamplingParams(repetition_penalty=2.0), prompt=[0, 1], output=[2, 2, 1])
    out = Sampler().apply_penalties(logits, [s])
    # seen in prompt or output: 0, 1, 2 (once each, however often they occur)
    assert out.tolist() == [[1.0, -4.0, 0.5, -1.0, 3.0, 0.5]]
    assert logits.tolist() == [[2.0, -2.0, 1.0, -1.0, 3.0, 0.5]]  # input untouched


def test_presence_and_frequency_over_output_only():
    logits = torch.zeros(1, 6)
    s = seq(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), prompt=[4, 4, 5], output=[1, 2, 2, 2])
    out = Sampler().apply_penalties(logits, [s])[0].tolist()
    assert out == pytest.approx([0.0, -0.75, -1.25, 0.0, 0.0, 0.0])


def test_penalties_per_row_and_combined():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 20, generator=g)
    seqs = [
        seq(SamplingParams(), prompt=[1], output=[1, 2]),
        seq(SamplingParams(repetition_penalty=1.5, frequency_penalty=-0.5), prompt=[3, 4], output=[4, 5, 5]),
        seq(SamplingParams(presence_penalty=1.0), prompt=[6], output=[7, 25]),  # 25: outside vocab, ignored
    ]
    out = Sampler().apply_penalties(logits, seqs)
    exp = logits.clone()
    for t in (3, 4, 5):
        exp[1, t] = exp[1, t] / 1.5 if exp[1, t] > 0 else exp[1, t] * 1.5
    exp[1, 4] += 0.5
    exp[1, 5] += 1.0
    exp[2, 7] -= 1.0
    torch.testing.assert_close(out, exp)


def test_repetition_prompt_cache_across_steps_and_free():
    sampler = Sampler()
    s = seq(SamplingParams(repetition_penalty=2.0), prompt=[0, 0, 1])
    logits = torch.full((1, 5), 4.0)
    assert sampler.apply_penalties(logits, [s]).tolist() == [[2.0, 2.0, 4.0, 4.0, 4.0]]
    s.append_token(3)
    assert sampler.apply_penalties(logits, [s]).tolist() == [[2.0, 2.0, 4.0, 2.0, 4.0]]
    sampler.free(s.seq_id)
    assert not sampler._prompt_ids and not sampler._generators


def test_penalty_changes_greedy_choice():
    logits = torch.tensor([[0.0, 2.0, 1.5]])
    s = seq(SamplingParams(temperature=0, frequency_penalty=1.0), output=[1])
    assert Sampler()(logits, [s]).token_ids == [2]


def test_min_tokens_masks_eos_and_stop_token_ids():
    logits = torch.tensor([[5.0, 4.0, 1.0, 3.0]])  # EOS=0 likeliest, then stop token 1
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1, 99], ignore_eos=True)
    sampler = Sampler([EOS])
    assert sampler(logits, [seq(p, output=[])]).token_ids == [3]
    assert sampler(logits, [seq(p, output=[3])]).token_ids == [3]
    assert sampler(logits, [seq(p, output=[3, 3])]).token_ids == [0]  # min_tokens reached
    sampled = sample_many(logits[0], SamplingParams(min_tokens=1, stop_token_ids=[1]), 300)
    assert not {0, 1} & set(sampled)


# --- seeds ----------------------------------------------------------------------------------------


def step_logits(step: int, rows: int, vocab: int = 1000) -> torch.Tensor:
    # The same distribution for every row at a given step, varying over steps.
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(1, vocab, generator=g).expand(rows, -1).clone()


def run_seeded(sampler: Sampler, seeded: SamplingParams, others: list[SamplingParams], pos: int) -> list[int]:
    target = seq(seeded)
    batch = [seq(p) for p in others]
    batch.insert(pos, target)
    for step in range(30):
        out = sampler(step_logits(step, len(batch)), batch)
        for s, t in zip(batch, out.token_ids):
            s.append_token(t)
    return target.output_token_ids


def test_seeded_rows_reproducible_alone_in_batch_and_across_instances():
    p = SamplingParams(seed=1234, temperature=0.9, top_p=0.95)
    alone = run_seeded(Sampler(), p, [], 0)
    torch.manual_seed(99)
    others = [SamplingParams(), SamplingParams(seed=5), SamplingParams(temperature=0), SamplingParams(top_k=5)]
    batched = run_seeded(Sampler(), p, others, 2)
    torch.manual_seed(7)
    batched2 = run_seeded(Sampler(), p, others[::-1] + [SamplingParams(min_p=0.1)], 5)
    assert alone == batched == batched2
    assert len(set(alone)) > 5  # actually random, not collapsed to greedy
    assert run_seeded(Sampler(), SamplingParams(seed=1235, temperature=0.9, top_p=0.95), [], 0) != alone


def test_huge_and_negative_seeds_are_accepted():
    logits = torch.zeros(2, 50)
    out = Sampler()(logits, [seq(SamplingParams(seed=2**80 + 3)), seq(SamplingParams(seed=-5))])
    assert all(0 <= t < 50 for t in out.token_ids)


def test_free_drops_generator():
    sampler = Sampler()
    s = seq(SamplingParams(seed=42))
    logits = torch.zeros(1, 1000)
    first = sampler(logits, [s]).token_ids
    assert sampler.num_seeded == 1
    sampler(logits, [s])
    sampler.free(s.seq_id)
    sampler.free(s.seq_id)  # idempotent
    assert sampler.num_seeded == 0
    assert sampler(logits, [s]).token_ids == first  # a fresh generator starts the stream again


# --- logprobs -------------------------------------------------------------------------------------


def test_logprobs_from_raw_logits_with_sorted_top():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 50, generator=g)
    seqs = [
        seq(SamplingParams(logprobs=5, temperature=0.3, repetition_penalty=1.3, top_k=3), output=[1, 2]),
        seq(SamplingParams()),
        seq(SamplingParams(logprobs=0, temperature=0)),
    ]
    out = Sampler()(logits, seqs)
    raw = torch.log_softmax(logits, -1)
    lp0 = out.logprobs[0]
    assert lp0 is not None
    assert lp0.logprob == pytest.approx(raw[0, out.token_ids[0]].item(), abs=1e-5)
    assert len(lp0.top) == 5
    top_vals, top_ids = raw[0].topk(5)
    assert [t for t, _ in lp0.top] == top_ids.tolist()
    assert [v for _, v in lp0.top] == pytest.approx(top_vals.tolist(), abs=1e-5)
    assert all(a[1] >= b[1] for a, b in zip(lp0.top, lp0.top[1:]))
    assert out.logprobs[1] is None
    lp2 = out.logprobs[2]
    assert lp2 is not None and lp2.top == [] and out.token_ids[2] == raw[2].argmax().item()
    chosen, top = lp2  # unpacks as the engine does
    assert chosen == lp2.logprob and top == []
    assert lp2.logprob == pytest.approx(raw[2].max().item(), abs=1e-5)
    assert all(math.isfinite(v) for _, v in lp0.top)
