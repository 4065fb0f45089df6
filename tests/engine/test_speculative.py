"""Speculative decoding: proposers, the lossless verification rules, KV rollback inside continuous
batching, and end to end on the embedded model (greedy and seeded outputs identical to plain
decoding in fp32, every token the plain model's greedy pick in bf16; sampled outputs follow the target
distribution)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from mainspring.engine.config import EngineConfig
from mainspring.engine.kv_cache import BlockManager
from mainspring.engine.params import SamplingParams
from mainspring.engine.sampler import Sampler
from mainspring.engine.scheduler import Scheduler
from mainspring.engine.sequence import Sequence
from mainspring.engine.speculative import (
    DraftView, NgramProposer, SpeculativeConfig, SpeculativeDecoder, rejection_sample,
)


def p_value(observed: list[int], probs: list[float]) -> float:
    """Pearson chi-square goodness of fit; the upper tail of chi2(df) is gammaincc(df/2, x/2)."""
    n = sum(observed)
    cells = [(o, p) for o, p in zip(observed, probs) if p > 0]
    assert sum(o for o, _ in cells) == n, "a sample fell where the target has zero probability"
    stat = sum((o - n * p) ** 2 / (n * p) for o, p in cells)
    return float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2), torch.tensor(stat / 2)))


# --- config ---------------------------------------------------------------------------------------


def test_settings_knob_parsing():
    parse = SpeculativeConfig.parse
    assert parse("") is None and parse("off") is None and parse(" none ") is None
    assert parse("ngram") == SpeculativeConfig("ngram")
    assert parse("ngram:k=5,n=2") == SpeculativeConfig("ngram", k=5, n=2)
    assert parse('{"method": "draft", "layers": [0, 1, 29]}') == SpeculativeConfig("draft", layers=(0, 1, 29))
    with pytest.raises(ValueError, match="method"):
        parse("medusa")
    with pytest.raises(ValueError, match="unknown speculative option"):
        parse("ngram:depth=3")
    with pytest.raises(ValueError, match="key=value"):
        parse("ngram:k")
    with pytest.raises(ValueError, match="positive"):
        SpeculativeConfig("ngram", k=0)
    with pytest.raises(ValueError, match="non-negative layer indices"):
        SpeculativeConfig("draft", layers=[0, -1])
    assert SpeculativeConfig("ngram").k == 10
    assert SpeculativeConfig("draft").k == 4


def test_draft_layers_skip_the_middle():
    cfg = SpeculativeConfig("draft", layers=20)
    assert cfg.draft_layers(30) == list(range(10)) + list(range(20, 30))
    assert SpeculativeConfig("draft", layers=5).draft_layers(30) == [0, 1, 2, 28, 29]
    assert SpeculativeConfig("draft").draft_layers(30) == list(range(10)) + list(range(20, 30))
    assert SpeculativeConfig("draft", layers=30).draft_layers(30) == list(range(30))
    with pytest.raises(ValueError, match="does not exist"):
        SpeculativeConfig("draft", layers=[0, 30]).draft_layers(30)


def test_guided_requests_fall_back_to_plain_decoding():
    assert SpeculativeDecoder.supports(SamplingParams(temperature=0.7, logprobs=2, repetition_penalty=1.2))
    assert not SpeculativeDecoder.supports(SamplingParams(guided_regex="[0-9]+"))
    assert not SpeculativeDecoder.supports(SamplingParams(guided_json_object=True))


# --- n-gram proposer --------------------------------------------------------------------------------


def test_ngram_prefers_the_longest_then_latest_match():
    ng = NgramProposer(max_n=3)
    # "1 2 3" occurs earlier followed by 4 5 6; "2 3" alone later is followed by 9
    assert ng.lookup([1, 2, 3, 4, 5, 6, 0, 2, 3, 9, 1, 2, 3], k=3) == [4, 5, 6]
    # no trigram match: the latest bigram match wins
    assert ng.lookup([7, 2, 3, 8, 0, 2, 3, 9, 5, 2, 3], k=2) == [9, 5]
    # unigram fallback, continuation cut at k and at the end of the context
    assert ng.lookup([4, 1, 2, 4], k=10) == [1, 2, 4]
    assert ng.lookup([4, 1, 2, 4], k=1) == [1]
    assert ng.lookup([1, 2, 3], k=5) == [] and ng.lookup([5], k=5) == [] and ng.lookup([1, 2, 1], k=0) == []
    assert NgramProposer(max_n=1).lookup([1, 2, 3, 9, 1, 2, 3], k=2) == [9, 1]


def test_ngram_ignores_byte_matches_across_token_boundaries():
    # little-endian int32: 256 = 00 01 00 00, 0 = 00 00 00 00, so the bytes of [256, 0] contain
    # the bytes of token 1 (01 00 00 00) at offset 1, which is not a token boundary
    assert NgramProposer(max_n=1).lookup([256, 0, 7, 1], k=3) == []
    assert NgramProposer(max_n=1).lookup([256, 0, 1, 7, 1], k=3) == [7, 1]


# --- verification rules ------------------------------------------------------------------------


def _spec_generate(P: torch.Tensor, Q: torch.Tensor | None, start: int, num_tokens: int, k: int,
                   gen: torch.Generator) -> list[int]:
    """A toy bigram 'model' P[prev] (target) and Q[prev] (draft; None: a point-mass draft that always
    guesses `prev + 1`), generated with speculative steps of k drafts until num_tokens exist."""
    out = [start]
    while len(out) < num_tokens + 1:
        draft, q_rows, prev = [], [], out[-1]
        for _ in range(k):
            if Q is None:
                d, q = (prev + 1) % P.shape[0], None
            else:
                q = Q[prev]
                d = int(torch.multinomial(q, 1, generator=gen))
            draft.append(d)
            q_rows.append(q if q is not None else torch.nn.functional.one_hot(torch.tensor(d), P.shape[0]).float())
            prev = d
        p = torch.stack([P[t] for t in [out[-1]] + draft])
        out += rejection_sample(p, torch.stack(q_rows), draft, gen)
    return out[1 : num_tokens + 1]


@pytest.mark.parametrize("draft_kind", ["distribution", "point_mass", "identical"])
def test_rejection_sampling_follows_the_target_distribution(draft_kind):
    g = torch.Generator().manual_seed(11)
    V = 5
    P = torch.softmax(torch.randn(V, V, generator=g) * 1.5, dim=-1)
    P[:, 4] = 0.0  # a token the target never emits, which the draft proposes
    P = P / P.sum(-1, keepdim=True)
    Q = {"distribution": torch.softmax(torch.randn(V, V, generator=g) * 1.5, dim=-1), "point_mass": None,
         "identical": P}[draft_kind]
    n = 6000
    pairs = Counter(tuple(_spec_generate(P, Q, 0, 2, 3, g)) for _ in range(n))
    expected = [float(P[0, a] * P[a, b]) for a in range(V) for b in range(V)]
    observed = [pairs.get((a, b), 0) for a in range(V) for b in range(V)]
    assert p_value(observed, expected) > 1e-3


def test_rejection_sample_accepts_identical_drafts_and_resamples_on_reject():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    assert rejection_sample(p, p[:2].clone(), [1, 2], torch.Generator().manual_seed(0))[:2] == [1, 2]
    # the target gives the draft zero probability: always rejected, replaced from p - q (so never 2)
    q = torch.tensor([[0.0, 0.0, 1.0]])
    outs = {tuple(rejection_sample(p[:2], q, [2], torch.Generator().manual_seed(s))) for s in range(50)}
    assert outs == {(0,), (1,)}


def test_sampled_match_uses_the_plain_samplers_noise_stream():
    """Verifying point-mass drafts by matching the plain sampler's own draw keeps seeded output
    identical to plain decoding, and consumes exactly one draw per emitted token."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=g)
    params = SamplingParams(temperature=0.9, top_k=20, seed=42)
    seq = Sequence("r", [1, 2, 3], params)

    plain_sampler = Sampler()
    plain = [plain_sampler(logits[i : i + 1], [seq]).token_ids[0] for i in range(6)]

    for wrong_at in (None, 0, 2):
        sampler = Sampler()
        dec = SpeculativeDecoder(SpeculativeConfig("ngram"), sampler)
        draft = list(plain[:5])
        if wrong_at is not None:
            draft[wrong_at] = (draft[wrong_at] + 1) % 50
        views = [DraftView(seq, draft[:j]) for j in range(6)]
        probs = sampler.probs(sampler.apply_penalties(logits, views), views)
        out = dec._match_sampled(draft, probs, views)
        n = 6 if wrong_at is None else wrong_at + 1
        assert out == plain[:n]
        # the generator advanced by exactly n draws: the next plain draw continues the stream
        if n < 6:
            assert sampler(logits[n : n + 1], [seq]).token_ids[0] == plain[n]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("wrong_at", [None, 1, 4])
def test_verification_equals_sequential_plain_sampling(temperature, wrong_at):
    """One verify pass over k drafts emits exactly what k+1 plain sampler steps would, with
    penalties that count the accepted drafts, min_tokens, top-k and a seed."""
    g = torch.Generator().manual_seed(5)
    V, k = 12, 5
    logits = torch.randn(k + 1, V, generator=g)
    logits[:, 3] += 3.0  # token 3 leads everywhere until penalized for having been emitted
    logits[:, 0] += 2.0  # EOS, masked while below min_tokens
    params = SamplingParams(temperature=temperature, top_k=6, repetition_penalty=1.8, presence_penalty=1.0,
                            frequency_penalty=0.5, min_tokens=4, seed=99)

    def fresh() -> Sequence:
        seq = Sequence("r", [1, 2], params)
        seq.token_ids.append(5)  # one output token so far
        return seq

    plain_seq, plain_sampler, plain = fresh(), Sampler([0]), []
    for j in range(k + 1):
        t = plain_sampler(logits[j : j + 1], [plain_seq]).token_ids[0]
        plain.append(t)
        plain_seq.token_ids.append(t)
    assert len(set(plain)) > 1 and 3 in plain  # the penalties did change the picks

    draft = plain[:k]
    if wrong_at is not None:
        draft[wrong_at] = 11 if draft[wrong_at] != 11 else 10
    sampler = Sampler([0])
    dec = SpeculativeDecoder(SpeculativeConfig("ngram"), sampler)
    seq = fresh()
    seq.spec_token_ids = draft
    tokens, _ = dec.sample(logits, [seq], lambda seqs: None)
    n = k + 1 if wrong_at is None else wrong_at + 1
    assert tokens[seq.seq_id] == plain[:n]


def test_penalties_at_draft_positions_count_the_drafts_before_them():
    params = SamplingParams(temperature=0.0, presence_penalty=2.0, repetition_penalty=1.5, min_tokens=3)
    seq = Sequence("r", [5, 6], params)
    seq.num_prompt_tokens = 2
    seq.token_ids.append(7)  # one output token so far
    views = [DraftView(seq, [8, 9][:j]) for j in range(3)]
    assert [v.output_token_ids for v in views] == [[7], [7, 8], [7, 8, 9]]
    assert [v.num_output_tokens for v in views] == [1, 2, 3]
    logits = torch.zeros(3, 12)
    logits[:, 8:10] = 1.0
    logits[:, 0] = 5.0  # EOS: masked below min_tokens (outputs 1 and 2), allowed at 3
    x = Sampler([0]).apply_penalties(logits, views)
    assert x[0, 0] == float("-inf") and x[1, 0] == float("-inf") and x[2, 0] == 5.0
    assert x[0, 8] == 1.0 and x[1, 8] == pytest.approx(1.0 / 1.5 - 2.0) and x[2, 9] == pytest.approx(1.0 / 1.5 - 2.0)


# --- scheduling and KV rollback -------------------------------------------------------------------


def make(num_blocks: int, block_size: int, budget: int, max_seqs: int = 8, k: int = 4) -> Scheduler:
    cfg = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget,
                       max_num_seqs=max_seqs)
    sched = Scheduler(cfg, BlockManager(num_blocks, block_size))
    sched.num_lookahead_tokens = k
    return sched


def spec_seq(rid: str, prompt: list[int], max_tokens: int, k: int = 4, arrival: float = 0.0) -> Sequence:
    seq = Sequence(rid, prompt, SamplingParams(max_tokens=max_tokens), arrival_time=arrival)
    seq.num_lookahead_tokens = k
    return seq


def test_lookahead_is_reserved_for_decodes_and_rolled_back():
    sched = make(num_blocks=16, block_size=4, budget=64)
    bm = sched.block_manager
    seq = spec_seq("a", [1, 2, 3, 4, 5, 6], max_tokens=20)
    sched.add(seq)
    out = sched.schedule()  # prefill: no drafts
    assert out.scheduled[0].num_spec_tokens == 0
    sched.postprocess(out, {seq.seq_id: 7})
    out = sched.schedule()
    s = out.scheduled[0]
    assert (s.num_tokens, s.num_spec_tokens, s.start) == (5, 4, 6)
    assert len(seq.block_table) == 3  # 7 tokens + 4 draft slots = 11 positions
    s.set_spec_tokens([8, 9, 10])
    assert s.num_tokens == 4 and s.token_ids == [7, 8, 9, 10] and s.samples
    sched.postprocess(out, {seq.seq_id: [8, 9, 42]})  # 8 and 9 accepted, 10 rejected, 42 sampled
    assert seq.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 42] and seq.spec_token_ids == []
    assert seq.num_computed_tokens == 9  # 42 is the next step's input
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 13
    # only full, computed blocks are hashed: [1..4], [5..8]; not [9, 42] (42's KV does not exist)
    hashed = [bm.blocks[b].token_ids for b in seq.block_table if bm.blocks[b].hash is not None]
    assert hashed == [(1, 2, 3, 4), (5, 6, 7, 8)]


def test_unused_lookahead_blocks_go_back_to_the_free_queue_head():
    sched = make(num_blocks=16, block_size=4, budget=64, k=8)
    bm = sched.block_manager
    seq = spec_seq("a", [1, 2, 3], max_tokens=30, k=8)
    sched.add(seq)
    sched.postprocess(sched.schedule(), {seq.seq_id: 4})
    out = sched.schedule()
    assert out.scheduled[0].num_spec_tokens == 8 and len(seq.block_table) == 3  # 4 tokens + 8 slots
    reserved = seq.block_table[1:]
    out.scheduled[0].set_spec_tokens([])  # the proposer had nothing
    assert out.scheduled[0].num_tokens == 1
    sched.postprocess(out, {seq.seq_id: 5})
    assert len(seq.block_table) == 2  # 5 tokens
    assert list(bm._free)[:1] == reserved[1:]  # handed out again before any cached block


def test_lookahead_never_preempts_and_respects_max_tokens_and_budget():
    sched = make(num_blocks=4, block_size=4, budget=64, k=8)
    a = spec_seq("a", [1, 2, 3, 4, 5, 6, 7], max_tokens=50, k=8, arrival=0.0)
    b = spec_seq("b", [9, 9, 9, 9, 9, 9, 9], max_tokens=4, k=8, arrival=1.0)
    for s in (a, b):
        sched.add(s)
    out = sched.schedule()
    sched.postprocess(out, {a.seq_id: 8, b.seq_id: 8})  # both hold 2 blocks, 8 tokens; pool empty
    out = sched.schedule()
    spec = {s.seq.request_id: s.num_spec_tokens for s in out.scheduled}
    # a needs a block for its draft slots but none is free: plain decode, nobody preempted
    assert not out.preempted and spec == {"a": 0, "b": 0}
    sched.postprocess(out, {a.seq_id: [1], b.seq_id: [1]})
    sched.finish(a, "stop")
    out = sched.schedule()
    # b: 2 outputs so far, max_tokens 4: one draft + the token after it is all it may still make
    assert {s.seq.request_id: s.num_spec_tokens for s in out.scheduled} == {"b": 1}
    small = make(num_blocks=16, block_size=4, budget=3, k=8)
    c = spec_seq("c", [1, 2], max_tokens=50, k=8)
    small.add(c)
    small.postprocess(small.schedule(), {c.seq_id: 3})
    assert small.schedule().scheduled[0].num_spec_tokens == 2  # budget 3 = 1 token + 2 drafts


@pytest.mark.parametrize("seed", range(8))
def test_random_simulation_with_drafts(seed):
    """Random drafts and acceptances inside continuous batching (chunked prefill, preemption,
    aborts, a shared prefix cache): every computed position always reads back the KV of the
    sequence's accepted tokens, never a rejected draft's, and blocks never leak."""
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8])
    num_blocks = rng.randint(12, 40)
    budget = rng.randint(4, 48)
    sched = make(num_blocks, bs, budget, max_seqs=rng.randint(1, 6), k=rng.randint(1, 6))
    bm = sched.block_manager
    prefix = [rng.randrange(4) for _ in range(12)]
    pending = []
    for i in range(rng.randint(4, 14)):
        total = rng.randint(3, num_blocks * bs)
        plen = rng.randint(1, total - 1)
        seq = spec_seq(f"s{i}", (prefix + [rng.randrange(4) for _ in range(plen)])[:plen], total - plen,
                       k=rng.choice([0, sched.num_lookahead_tokens]), arrival=float(i))
        pending.append(seq)
    all_seqs = list(pending)
    kv: dict[int, tuple] = {}  # slot -> the token prefix whose KV the "model" wrote there

    for _ in range(20000):
        if not (pending or sched.has_unfinished()):
            break
        while pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        if sched.running and rng.random() < 0.01:
            sched.abort(rng.choice(sched.running).request_id)
        out = sched.schedule()
        for s in out.scheduled:
            if s.num_spec_tokens:
                s.set_spec_tokens([rng.randrange(4) for _ in range(rng.randint(0, s.num_spec_tokens))])
        assert out.num_batched_tokens <= budget
        for s in out.scheduled:
            seq = s.seq
            for p in range(s.start):  # what attention reads: computed positions only
                assert kv.get(bm.slot(seq, p)) == tuple(seq.token_ids[: p + 1]), (seed, seq.request_id, p)
            ids = seq.token_ids + seq.spec_token_ids
            for p in s.positions:
                blk = bm.blocks[seq.block_table[p // bs]]
                assert blk.ref_count == 1 and blk.hash is None, "writing into a shared or cached block"
                kv[bm.slot(seq, p)] = tuple(ids[: p + 1])
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                d = s.seq.spec_token_ids
                accepted = rng.randint(0, len(d))
                sampled[s.seq.seq_id] = d[:accepted] + [rng.randrange(4)] if d else rng.randrange(4)
        sched.postprocess(out, sampled)
        for s in out.scheduled:
            seq = s.seq
            if seq.is_finished:
                continue
            assert seq.spec_token_ids == []
            if s.samples:
                assert seq.num_computed_tokens == seq.num_tokens - 1
                assert len(seq.block_table) <= bm.blocks_needed(seq), "lookahead blocks leaked"
            for j, b in enumerate(seq.block_table):
                if bm.blocks[b].hash is not None:  # hashed blocks hold accepted, computed tokens
                    assert (j + 1) * bs <= seq.num_computed_tokens
                    assert bm.blocks[b].token_ids == tuple(seq.token_ids[j * bs : (j + 1) * bs])
            if seq.num_output_tokens >= seq.params.max_tokens:
                del seq.token_ids[seq.num_prompt_tokens + seq.params.max_tokens :]
                sched.finish(seq, "length")
        held = Counter(b for s in sched.running for b in s.block_table)
        assert all(blk.ref_count == held[blk.block_id] for blk in bm.blocks)
        assert bm.num_free_blocks == sum(1 for blk in bm.blocks if blk.ref_count == 0)
    else:
        pytest.fail("simulation did not finish")
    assert bm.num_free_blocks == num_blocks
    assert all(s.is_finished for s in all_seqs)


# --- end to end on the embedded model ------------------------------------------------------------

COPY_SOURCE = '''def summarize(records, threshold):
    total = 0
    count = 0
    for record in records:
        value = record["value"]
        if value < threshold:
            continue
        total += value
        count += 1
    return {"total": total, "count": count}
'''


def _chat(tok, text: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


@pytest.fixture(scope="module")
def prompts(embedded):
    tok = embedded.tokenizer
    return [
        _chat(tok, "Copy this code exactly, adding a docstring.\n\n```python\n" + COPY_SOURCE + "```"),  # copies
        _chat(tok, "What is the capital of France?"),
        tok.encode("one two three four five one two three four five one two three"),  # repeating text
        _chat(tok, "Count from 1 to 20, separated by commas."),
        _chat(tok, "Write a haiku about the sea."),
        tok.encode("one two three four five one two three four five one two three"),
        tok.encode("one two three four five one two three four five one two three"),
    ]


TWO = 827  # " two" in SmolLM2's vocabulary (checked below)


def _params() -> list[SamplingParams]:
    g = SamplingParams(temperature=0.0, max_tokens=40)
    # the repeating prompts continue " five one two three ...", copied from the prompt by the
    # n-gram drafts: the stops land inside accepted runs
    return [g, g, SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),  # max_tokens inside a run
            SamplingParams(temperature=0.0, max_tokens=40, stop=["8."]),
            SamplingParams(temperature=0.0, max_tokens=12, logprobs=2),
            SamplingParams(temperature=0.0, max_tokens=20, stop=[" one"]),  # a stop string inside a run
            SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[TWO])]  # a stop token inside a run


@pytest.fixture(scope="module")
def plain_outputs(embedded, prompts):
    from mainspring.engine.engine import LLMEngine

    return LLMEngine(embedded, EngineConfig(kv_cache_mb=64)).generate(prompts, _params())


def _same(got, want) -> None:
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text
        assert (g.finish_reason, g.stop_reason) == (w.finish_reason, w.stop_reason)
        if w.logprobs is not None:
            assert [lp.token_id for lp in g.logprobs] == [lp.token_id for lp in w.logprobs]
            assert [lp.logprob for lp in g.logprobs] == pytest.approx([lp.logprob for lp in w.logprobs], abs=1e-3)


@pytest.mark.slow
def test_ngram_greedy_is_token_identical_batched_chunked_and_preempted(embedded, prompts, plain_outputs):
    from mainspring.engine.engine import LLMEngine

    # a small token budget chunks the copy prompt's prefill while the others decode and verify;
    # a pool of 14 blocks (224 tokens) for ~340 forces preemption with drafts in flight
    engine = LLMEngine(embedded, EngineConfig(num_blocks=14, max_num_batched_tokens=48,
                                              speculative=SpeculativeConfig("ngram", k=6)))
    _same(engine.generate(prompts, _params()), plain_outputs)
    assert engine.scheduler.num_preemptions > 0
    assert [o.finish_reason for o in plain_outputs[5:]] == ["stop", "stop"]
    assert prompts[6][1] == TWO and plain_outputs[5].text == " five" and plain_outputs[6].token_ids[-1] == TWO
    assert engine.spec.num_accepted_tokens >= 40  # the copy and repeat prompts ran mostly on drafts
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert plain_outputs[3].finish_reason == "stop" and plain_outputs[2].finish_reason == "length"


@pytest.mark.slow
def test_draft_model_greedy_is_token_identical_batched(embedded, prompts, plain_outputs):
    from mainspring.engine.engine import LLMEngine

    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, speculative=SpeculativeConfig("draft", k=3)))
    _same(engine.generate(prompts, _params()), plain_outputs)
    assert engine.spec.num_accepted_tokens > 0


@pytest.mark.slow
def test_ngram_drafts_with_decode_graphs_are_token_identical(embedded, prompts, plain_outputs):
    """On CUDA decode-only steps replay captured graphs and verify steps run eager; "static" runs the graphs'
    fixed-shape path on the CPU, so the mix of the two, lookahead blocks in the tables included, is checked here."""
    from mainspring.engine.engine import LLMEngine

    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, decode_graphs="static",
                                              speculative=SpeculativeConfig("ngram", k=4)))
    _same(engine.generate(prompts, _params()), plain_outputs)
    assert engine.runner.graphs.replays > 0 and engine.spec.num_accepted_tokens > 0


def greedy_gaps(plain, prompt: list[int], token_ids: list[int]) -> list[float]:
    """For each generated token, how far (in log-probability) it falls below the plain engine's greedy pick
    for the same prefix, scoring prompt + tokens in one teacher-forced pass: 0.0 where it is that pick."""
    scored = plain.generate([prompt + token_ids], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    return [lp.top[0].logprob - lp.logprob for lp in scored.prompt_logprobs[len(prompt):]]


@pytest.mark.slow
@pytest.mark.parametrize("method,k", [("ngram", 6), ("draft", 3)])
def test_bf16_drafts_keep_every_token_the_plain_models_greedy_pick(embedded, prompts, method, k):
    """In bf16 a verify forward's k + 1 rows and a decode's one row round differently, and so do a batch and a
    chunked prefill, so outputs are not compared token for token with a plain run (near ties in the repeating
    prompts flip either way). What must hold: every token speculation emits is the plain bf16 model's greedy
    pick for that prefix, up to bf16 rounding. A verifier that kept wrong drafts emits tokens 2-17 nats below it."""
    from mainspring.engine.engine import LLMEngine

    plain = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, dtype="bf16"))
    engine = LLMEngine(embedded, EngineConfig(num_blocks=28, max_num_batched_tokens=48, dtype="bf16",
                                              speculative=SpeculativeConfig(method, k=k)))
    assert engine.runner.cache.dtype == torch.bfloat16
    outs = engine.generate(prompts, _params())
    for prompt, out in zip(prompts, outs):
        assert max(greedy_gaps(plain, prompt, out.token_ids)) <= 0.5, (out.text, method)
    assert engine.spec.num_accepted_tokens >= 30  # mostly the copy and repeat prompts
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.slow
def test_blocks_hashed_during_verification_serve_later_requests(embedded, prompts, plain_outputs):
    """The prefix cache registers blocks of accepted tokens written by verify forwards; a request
    continuing that text hits them and still decodes exactly as plain decoding does."""
    from mainspring.engine.engine import LLMEngine

    first = plain_outputs[0]
    longer = first.prompt_token_ids + first.token_ids[:30]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    want = LLMEngine(embedded, EngineConfig(kv_cache_mb=64)).generate([longer], params)[0]
    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, speculative=SpeculativeConfig("ngram")))
    engine.generate([prompts[0]], _params()[0])
    got = engine.generate([longer], params)[0]
    assert got.usage.cached_tokens > len(first.prompt_token_ids)  # hit blocks of generated tokens
    assert got.token_ids == want.token_ids


@pytest.mark.slow
def test_seeded_sampling_with_ngram_drafts_is_identical_to_plain(embedded, prompts):
    from mainspring.engine.engine import LLMEngine

    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=7),
              SamplingParams(temperature=1.0, top_k=40, repetition_penalty=1.1, presence_penalty=0.3,
                             max_tokens=24, seed=8, min_tokens=5),
              SamplingParams(temperature=0.0, max_tokens=24)]
    batch = [prompts[0], prompts[2], prompts[1]]
    want = LLMEngine(embedded, EngineConfig(kv_cache_mb=64)).generate(batch, params)
    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, speculative=SpeculativeConfig("ngram")))
    got = engine.generate(batch, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engine.spec.num_accepted_tokens > 0


@pytest.mark.slow
def test_draft_model_sampling_follows_the_target_distribution(embedded):
    """Chi-square on the first two sampled tokens (top_k=3, temperature 1): the second comes from
    the draft-model rejection rule, and must follow the target model's exact distribution."""
    from mainspring.engine.attention import AttentionMetadata
    from mainspring.engine.engine import LLMEngine
    from mainspring.engine.model import CausalLM

    tok = embedded.tokenizer
    prompt = tok.encode("My favourite colour is")
    # one wave of 256: power enough, since a wrong rule would follow the draft's q, which is far
    # from p here (the draft agrees 12-40% of the time)
    n = 256
    engine = LLMEngine(embedded, EngineConfig(kv_cache_mb=64, max_num_seqs=n, max_num_batched_tokens=4096,
                                              speculative=SpeculativeConfig("draft", k=2)))
    params = [SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, seed=i) for i in range(n)]
    outs = engine.generate([prompt] * n, params)
    assert engine.spec.num_draft_tokens > 0 and 0 < engine.spec.acceptance_rate < 1  # rejections happened

    model = CausalLM.from_weights(embedded.config, embedded.state_dict)
    c = embedded.config

    def top3(ids: list[int]) -> dict[int, float]:
        cache = [(torch.zeros(64, c.num_key_value_heads, c.head_dim),
                  torch.zeros(64, c.num_key_value_heads, c.head_dim))
                 for _ in range(c.num_hidden_layers)]
        meta = AttentionMetadata.build([], [([0, 1, 2, 3], 0, len(ids))], 16)
        with torch.inference_mode():
            logits = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), cache, meta))[-1]
        top = logits.topk(3)
        return dict(zip(top.indices.tolist(), torch.softmax(top.values, -1).tolist()))

    first = top3(prompt)
    expected = {(a, b): pa * pb for a, pa in first.items() for b, pb in top3(prompt + [a]).items()}
    counts = Counter((o.token_ids[0], o.token_ids[1]) for o in outs)
    assert set(counts) <= set(expected)
    cells = sorted(expected)
    assert p_value([counts.get(x, 0) for x in cells], [expected[x] for x in cells]) > 1e-3
