"""Scheduler: token budget, chunked prefill, mixed batches, preemption, priorities, and a
randomized simulation that checks block and KV invariants step by step."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from mainspring.engine.config import EngineConfig
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.kv_cache import BlockManager
from mainspring.engine.params import SamplingParams
from mainspring.engine.scheduler import Scheduler, SchedulerOutput
from mainspring.engine.sequence import Sequence, SequenceStatus

_arrival = iter(range(10**9))


def mk(n: int, start: int = 0, max_tokens: int = 4, priority: int = 0, rid: str | None = None) -> Sequence:
    t = next(_arrival)
    return Sequence(
        rid or f"r{t}",
        list(range(start, start + n)),
        SamplingParams(max_tokens=max_tokens),
        priority=priority,
        arrival_time=float(t),
    )


def make(num_blocks: int = 64, block_size: int = 4, budget: int = 64, max_seqs: int = 8) -> Scheduler:
    cfg = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_num_batched_tokens=budget,
                       max_num_seqs=max_seqs)
    return Scheduler(cfg, BlockManager(num_blocks, block_size))


def step(sched: Scheduler, token: int = 7) -> SchedulerOutput:
    """One engine step: schedule, 'run the model', postprocess, stop on max_tokens."""
    out = sched.schedule()
    sched.postprocess(out, {s.seq.seq_id: token for s in out.scheduled if s.samples})
    for s in out.scheduled:
        seq = s.seq
        if not seq.is_finished and seq.num_output_tokens >= seq.params.max_tokens:
            sched.finish(seq, "length")
    return out


def chunks(out: SchedulerOutput) -> dict[str, int]:
    return {s.seq.request_id: s.num_tokens for s in out.scheduled}


def test_chunked_prefill_respects_budget():
    sched = make(budget=8)
    seq = mk(20, rid="a")
    sched.add(seq)
    out = sched.schedule()
    assert chunks(out) == {"a": 8} and not out.scheduled[0].samples
    assert out.scheduled[0].token_ids == list(range(8))
    assert len(seq.block_table) == 5  # blocks for the whole prompt at admission
    sched.postprocess(out, {})
    assert seq.num_computed_tokens == 8 and seq.num_tokens == 20
    out = step(sched)
    assert chunks(out) == {"a": 8}
    out = step(sched)
    assert chunks(out) == {"a": 4} and out.scheduled[0].samples
    assert seq.num_tokens == 21 and seq.num_computed_tokens == 20
    out = step(sched)
    assert chunks(out) == {"a": 1} and out.scheduled[0].positions == range(20, 21)
    assert out.num_batched_tokens == 1


def test_decodes_batched_with_a_prefill_chunk():
    sched = make(budget=10)
    a, b = mk(3, rid="a", max_tokens=10), mk(3, start=100, rid="b", max_tokens=10)
    sched.add(a)
    sched.add(b)
    assert chunks(step(sched)) == {"a": 3, "b": 3}
    sched.add(mk(30, start=200, rid="c"))
    out = step(sched)
    assert chunks(out) == {"a": 1, "b": 1, "c": 8}  # decodes first, prefill fills the rest
    assert out.num_batched_tokens == 10
    assert [s.samples for s in out.scheduled] == [True, True, False]
    assert chunks(step(sched)) == {"a": 1, "b": 1, "c": 8}
    for seq in (a, b):
        assert seq.num_computed_tokens == seq.num_tokens - 1


def test_max_num_seqs_limits_admission():
    sched = make(max_seqs=2)
    for _ in range(3):
        sched.add(mk(2))
    out = step(sched)
    assert len(out.scheduled) == 2 and sched.num_running == 2 and sched.num_waiting == 1


def test_preemption_victim_is_latest_and_rerun_hits_its_own_blocks():
    sched = make(num_blocks=6, block_size=4, budget=64)
    bm = sched.block_manager
    a = mk(8, start=0, max_tokens=8, rid="a")
    b = mk(8, start=100, max_tokens=8, rid="b")  # same priority, arrives later
    sched.add(a)
    sched.add(b)
    preempted = []
    for _ in range(8):
        out = step(sched)
        preempted += out.preempted
        if preempted:
            break
    assert preempted == [b]
    assert b.status == SequenceStatus.WAITING and b.num_preemptions == 1
    assert b.block_table == [] and b.num_computed_tokens == 0
    assert sched.waiting[0] is b and a.status == SequenceStatus.RUNNING
    generated = b.output_token_ids
    assert len(generated) == 5
    while not a.is_finished:
        step(sched)
    out = step(sched)  # b is re-admitted with its generated tokens
    assert b.status == SequenceStatus.RUNNING
    assert b.num_cached_tokens == 8  # its prompt blocks survived in the prefix cache
    assert b.usage_cached_tokens == 0  # billing counts the first admission only
    assert chunks(out) == {"b": 8 + 5 - 8}  # prompt + 5 generated, minus the 8 cached
    assert out.scheduled[0].samples and b.num_computed_tokens == 13
    while sched.has_unfinished():
        step(sched)
    assert b.output_token_ids[:5] == generated and b.num_output_tokens == 8
    assert bm.num_free_blocks == 6


def test_preemption_picks_lowest_priority_not_latest():
    sched = make(num_blocks=5, block_size=4)
    low = mk(4, start=0, priority=5, max_tokens=8, rid="low")  # arrives first
    high = mk(4, start=100, priority=0, max_tokens=8, rid="high")
    mid = mk(4, start=200, priority=1, max_tokens=8, rid="mid")
    for s in (low, high, mid):
        sched.add(s)
    out = step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["high", "mid", "low"]
    victims = []
    while not victims:
        victims = step(sched).preempted
    assert victims == [low]


def test_waiting_order_priority_then_arrival():
    sched = make(max_seqs=1)
    seqs = [mk(2, priority=p, rid=f"p{p}-{i}") for i, p in enumerate([2, 0, 1, 0, 2])]
    for s in seqs:
        sched.add(s)
    assert [s.request_id for s in sched.waiting] == ["p0-1", "p0-3", "p1-2", "p2-0", "p2-4"]
    order = []
    while sched.has_unfinished():
        out = step(sched)
        order += [s.seq.request_id for s in out.scheduled if s.seq.request_id not in order]
    assert order == ["p0-1", "p0-3", "p1-2", "p2-0", "p2-4"]


def test_priority_preemption_for_urgent_waiting_seq():
    sched = make(num_blocks=4, block_size=4, budget=64)
    low = mk(12, priority=3, max_tokens=4, rid="low")  # 16 tokens at most: fits the pool
    sched.add(low)
    step(sched)
    # low holds 3 blocks; its next decode takes the 4th, leaving none for urgent (2 blocks).
    assert low.status == SequenceStatus.RUNNING and sched.block_manager.num_free_blocks == 1
    urgent = mk(6, start=50, priority=0, rid="urgent")
    sched.add(urgent)
    out = sched.schedule()
    assert out.preempted == [low] and low.status == SequenceStatus.WAITING
    assert chunks(out) == {"urgent": 6}  # low's decode token was taken back out of the batch
    assert out.num_batched_tokens == 6
    sched.postprocess(out, {urgent.seq_id: 1})
    while sched.has_unfinished():
        step(sched)
    assert low.num_output_tokens == 4 and urgent.num_output_tokens == 4
    assert low.finish_reason == urgent.finish_reason == "length"


def test_no_preemption_or_skipping_for_equal_priority():
    sched = make(num_blocks=4, block_size=4)
    first = mk(12, priority=1, max_tokens=4, rid="first")
    sched.add(first)
    step(sched)
    blocked = mk(6, start=50, priority=1, rid="blocked")  # needs 2 blocks, 0 free
    small = mk(1, start=90, priority=2, rid="small")  # would fit, but must not skip ahead
    sched.add(blocked)
    sched.add(small)
    out = step(sched)
    assert chunks(out) == {"first": 1} and not out.preempted
    assert [s.request_id for s in sched.waiting] == ["blocked", "small"]


def test_priority_preemption_skipped_when_it_cannot_help():
    sched = make(num_blocks=4, block_size=4)
    high = mk(8, priority=0, max_tokens=8, rid="high")  # 2 blocks (3 once decoding)
    low = mk(3, start=50, priority=5, max_tokens=8, rid="low")  # 1 block
    sched.add(high)
    sched.add(low)
    step(sched)
    huge = mk(16, start=100, priority=1, rid="huge")  # 4 blocks: never fits while high runs
    sched.add(huge)
    out = step(sched)
    assert not out.preempted and low.status == SequenceStatus.RUNNING


def test_abort_frees_blocks():
    sched = make(num_blocks=8)
    bm = sched.block_manager
    a, b = mk(6, rid="a"), mk(6, start=50, rid="b")
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert bm.num_free_blocks == 4
    assert sched.abort("a") is a  # aborted while the step is running
    assert a.status == SequenceStatus.FINISHED and a.finish_reason == "abort"
    assert a.block_table == [] and bm.num_free_blocks == 6
    sched.postprocess(out, {a.seq_id: 1, b.seq_id: 1})  # a is skipped
    assert a.num_tokens == 6 and b.num_tokens == 7
    c = mk(3, start=90, rid="c")
    sched.add(c)
    assert sched.abort("c") is c and sched.num_waiting == 0
    assert sched.abort("nope") is None
    sched.finish(b, "stop")
    assert not sched.has_unfinished() and bm.num_free_blocks == 8


def test_too_long_prompt_rejected_on_add():
    sched = make(num_blocks=4, block_size=4)
    with pytest.raises(InvalidRequestError, match=r"needs 5 KV blocks .* has 4"):
        sched.add(mk(17))
    with pytest.raises(InvalidRequestError):
        sched.add(mk(0))
    assert not sched.has_unfinished()
    sched.add(mk(16))


def test_seq_outgrowing_the_pool_is_finished_not_parked():
    sched = make(num_blocks=2, block_size=4)
    seq = mk(7, max_tokens=10)
    sched.add(seq)
    finished = []
    for _ in range(5):
        out = step(sched)
        finished += out.finished
    assert finished == [seq] and seq.finish_reason == "length"
    assert seq.num_tokens == 9 and not sched.has_unfinished()
    assert sched.block_manager.num_free_blocks == 2


def test_postprocess_requires_sampled_token():
    sched = make()
    sched.add(mk(3))
    out = sched.schedule()
    with pytest.raises(ValueError, match="no sampled token"):
        sched.postprocess(out, {})


# ---- randomized simulation -------------------------------------------------------------------


def _check_blocks(sched: Scheduler) -> None:
    bm = sched.block_manager
    held = Counter(b for s in sched.running for b in s.block_table)
    for blk in bm.blocks:
        assert blk.ref_count >= 0
        assert blk.ref_count == held[blk.block_id], "ref_count != number of tables holding it"
    assert bm.num_free_blocks == sum(1 for blk in bm.blocks if blk.ref_count == 0)
    for h, bid in bm._cached.items():
        assert bm.blocks[bid].hash == h
    for s in sched.waiting:
        assert s.block_table == [] and s.status == SequenceStatus.WAITING
    for s in sched.running:
        assert s.status == SequenceStatus.RUNNING
        assert len(s.block_table) * bm.block_size >= s.num_tokens - 1


@pytest.mark.parametrize("seed", range(12))
def test_random_simulation(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 8])
    num_blocks = rng.randint(8, 40)
    budget = rng.randint(1, 48)
    sched = make(num_blocks=num_blocks, block_size=bs, budget=budget, max_seqs=rng.randint(1, 8))
    bm = sched.block_manager
    capacity = num_blocks * bs
    prefixes = [[rng.randrange(5) for _ in range(rng.randint(1, 24))] for _ in range(3)]
    pending: list[Sequence] = []
    for i in range(rng.randint(5, 25)):
        total = rng.randint(2, capacity)  # prompt + max_tokens always fits the pool
        prompt_len = rng.randint(1, total - 1)
        prompt = (rng.choice(prefixes) + [rng.randrange(5) for _ in range(prompt_len)])[:prompt_len]
        seq = Sequence(
            f"s{i}",
            prompt,
            SamplingParams(max_tokens=total - prompt_len),
            priority=rng.randint(0, 2),
            arrival_time=float(i),
            cache_salt=rng.choice([None, None, "x"]),
        )
        pending.append(seq)
    all_seqs = list(pending)
    aborted: set[str] = set()
    kv: dict[int, tuple] = {}  # slot -> what the model wrote there: (salt, tokens up to it)

    def content(seq: Sequence, pos: int) -> tuple:
        return (seq.cache_salt, tuple(seq.token_ids[: pos + 1]))

    for _ in range(20000):
        if not (pending or sched.has_unfinished()):
            break
        while pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        if sched.running and rng.random() < 0.01:
            victim = rng.choice(sched.running)
            aborted.add(victim.request_id)
            sched.abort(victim.request_id)
        out = sched.schedule()
        assert out.num_batched_tokens <= budget
        assert len(out.scheduled) <= sched.max_num_seqs
        assert not out.finished  # every request fits the pool
        written: set[int] = set()
        for s in out.scheduled:
            seq = s.seq
            assert s.num_tokens >= 1 and s.start == seq.num_computed_tokens
            assert s.end <= seq.num_tokens
            # Everything already computed (incl. prefix-cache hits) reads back the right KV.
            for p in range(s.start):
                assert kv.get(bm.slot(seq, p)) == content(seq, p), (seed, seq.request_id, p)
            for p in s.positions:
                blk = seq.block_table[p // bs]
                assert bm.blocks[blk].ref_count == 1, "writing into a shared block"
                assert bm.blocks[blk].hash is None, "writing into a cached block"
                slot = bm.slot(seq, p)
                assert slot not in written
                written.add(slot)
                kv[slot] = content(seq, p)
        _check_blocks(sched)
        sampled = {s.seq.seq_id: rng.randrange(5) for s in out.scheduled if s.samples}
        sched.postprocess(out, sampled)
        for s in out.scheduled:
            seq = s.seq
            if s.samples:
                assert seq.num_computed_tokens == seq.num_tokens - 1
            if seq.num_output_tokens >= seq.params.max_tokens:
                sched.finish(seq, "length")
        _check_blocks(sched)
    else:
        pytest.fail("simulation did not finish")

    assert not sched.has_unfinished()
    assert bm.num_free_blocks == num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    for seq in all_seqs:
        assert seq.is_finished
        if seq.request_id not in aborted:
            assert seq.finish_reason == "length"
            assert seq.num_output_tokens == seq.params.max_tokens
            assert seq.usage_cached_tokens is not None
            assert seq.usage_cached_tokens < seq.num_prompt_tokens


def test_shared_prefix_waits_for_the_blocks_being_computed():
    """Requests arriving together with one system prompt compute it once, not once each."""
    sched = make(budget=16)
    first, second = mk(30, rid="a"), mk(30, rid="b")  # identical 30-token prompts: 7 full blocks
    second.token_ids[-1] = 999  # differ only in the last token
    sched.add(first)
    sched.add(second)
    out = step(sched)
    assert chunks(out) == {"a": 16}  # b waits: a is computing the blocks b would reuse
    out = step(sched)
    assert chunks(out)["a"] == 14
    assert "b" not in chunks(out)  # blocks 4-6 were still pending when the step was planned
    out = step(sched)
    assert second.num_cached_tokens == 28 and chunks(out)["b"] == 2
    assert sched.block_manager.stats().prefix_cache_hits == 28


def test_waiting_does_not_outlive_a_preempted_owner():
    sched = make(budget=16)
    owner, other = mk(30, rid="a"), mk(30, rid="b")
    sched.add(owner)
    sched.add(other)
    step(sched)
    sched.abort("a")  # the blocks b waited for will never be computed
    out = step(sched)
    assert chunks(out) == {"b": 14} and other.num_cached_tokens == 16  # a's computed blocks stay cached
