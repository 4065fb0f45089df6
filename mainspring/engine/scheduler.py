"""Continuous batching with chunked prefill, priorities and recompute preemption.

Each step mixes decode tokens of running sequences with (chunks of) prefills of newly admitted
ones under one token budget, as vLLM V1 does. When the KV pool runs out, the lowest-priority
running sequence is preempted: its blocks are freed and it goes back to waiting, to be
recomputed later (mostly from the prefix cache, since its freed blocks keep their hashes).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from mainspring.engine.config import EngineConfig
from mainspring.engine.errors import InvalidRequestError
from mainspring.engine.kv_cache import BlockManager
from mainspring.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """Compute seq.token_ids[start : start + num_tokens] this step (start = num_computed_tokens
    when scheduled; captured so it stays valid after postprocess advances the sequence).

    Speculative decoding: the last num_spec_tokens of num_tokens are draft tokens
    (seq.spec_token_ids) after the sequence's last token; the model returns logits for all of
    them and the last token, and postprocess keeps the KV of the accepted ones only."""

    seq: Sequence
    num_tokens: int
    num_spec_tokens: int = 0
    start: int = field(init=False)
    _samples: bool = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.start = self.seq.num_computed_tokens
        self._samples = self.start + self.num_tokens - self.num_spec_tokens == self.seq.num_tokens

    def set_spec_tokens(self, draft: list[int]) -> None:
        """Verify `draft` (at most the num_spec_tokens slots reserved) after the last token."""
        if len(draft) > self.num_spec_tokens:
            raise ValueError(f"{len(draft)} draft tokens but {self.num_spec_tokens} slots reserved")
        self.seq.spec_token_ids = list(draft)
        self.num_tokens += len(draft) - self.num_spec_tokens
        self.num_spec_tokens = len(draft)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk completes the sequence: the model samples its next token."""
        return self._samples

    @property
    def token_ids(self) -> list[int]:
        ids = self.seq.token_ids[self.start : self.end]
        return ids + self.seq.spec_token_ids[: self.num_spec_tokens] if self.num_spec_tokens else ids

    @property
    def positions(self) -> range:
        return range(self.start, self.end)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # Ended by the scheduler itself (finish_reason "length"): the sequence outgrew the whole KV
    # pool and could never be re-admitted. The engine must emit their final output.
    finished: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


def _rank(seq: Sequence) -> tuple[int, float, int]:
    """Sort key: more urgent first; latest arrival last (seq_id breaks exact ties)."""
    return (seq.priority, seq.arrival_time, seq.seq_id)


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        if config.max_num_batched_tokens < 1 or config.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if config.block_size != block_manager.block_size:
            raise ValueError(
                f"config.block_size ({config.block_size}) != block_manager.block_size ({block_manager.block_size})"
            )
        self.config = config
        self.block_manager = block_manager
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        # Speculative decoding (set by the engine): > 0 reserves draft slots for the sequences
        # whose own num_lookahead_tokens is > 0.
        self.num_lookahead_tokens = 0
        # waiting: sorted by priority; within a priority, preempted seqs at the front, then
        # arrival (add) order. running: sorted by _rank, so the victim is always running[-1].
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0  # since start, for stats

    # ---- queues ----------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a new request. Rejects one that could never fit in the KV pool."""
        if seq.num_tokens == 0:
            raise InvalidRequestError("the prompt is empty; it needs at least one token")
        bm = self.block_manager
        need = self._max_blocks(seq)
        if need > bm.num_blocks:
            raise InvalidRequestError(
                f"the prompt needs {need} KV blocks ({seq.num_tokens} tokens, {bm.block_size} per "
                f"block) but the KV cache has {bm.num_blocks}; shorten the prompt or enlarge the "
                "KV cache (kv_cache_mb / num_blocks)"
            )
        seq.status = SequenceStatus.WAITING
        # End of its priority group = arrival order among equals.
        self.waiting.insert(bisect.bisect_right(self.waiting, seq.priority, key=_prio), seq)

    def _max_blocks(self, seq: Sequence) -> int:
        """Most blocks `seq` holds at once: all its tokens' unless a sliding window bounds it."""
        bounded = seq.kv_policy.max_blocks(self.block_manager.block_size, self.max_num_batched_tokens) \
            if seq.kv_policy is not None else None
        need = self.block_manager.blocks_needed(seq)
        return need if bounded is None else min(need, bounded)

    def _upto(self, seq: Sequence, budget: int) -> int | None:
        """A sequence under a KV policy gets blocks for this step's chunk only, so a long prompt
        never holds more hot blocks than its window or hot span (None: blocks for all tokens)."""
        if seq.kv_policy is None:
            return None
        return seq.num_computed_tokens + min(seq.num_uncomputed_tokens, budget)

    def _requeue_front(self, seq: Sequence) -> None:
        # Front of its priority group: a preempted seq was admitted before anything still waiting
        # at its priority, so it keeps its turn.
        self.waiting.insert(bisect.bisect_left(self.waiting, seq.priority, key=_prio), seq)

    def _remove(self, seq: Sequence) -> None:
        for queue in (self.running, self.waiting):
            for i, s in enumerate(queue):
                if s is seq:
                    del queue[i]
                    return

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` (stop, length, abort): free its blocks and drop it from the queues."""
        self._remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self, request_id: str) -> Sequence | None:
        for queue in (self.running, self.waiting):
            for s in queue:
                if s.request_id == request_id:
                    self.finish(s, "abort")
                    return s
        return None

    def _preempt(self, seq: Sequence) -> None:
        self._remove(seq)
        self.block_manager.deallocate(seq)
        seq.kv_snapped, seq.snap_scores = False, None  # recomputed from scratch: SnapKV votes again
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self._requeue_front(seq)

    # ---- one step ------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        bm = self.block_manager
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens

        # 1. Running sequences, most urgent first: a decode token each, or the next prefill chunk.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_uncomputed_tokens <= 0:  # nothing new to compute (engine gave no token)
                i += 1
                continue
            # Make room by preempting the least urgent running seq. running is sorted, so the
            # victim is never a seq already scheduled this step (they rank above `seq`).
            upto = self._upto(seq, budget)
            while not bm.can_append(seq, upto=upto) and self.running[-1] is not seq:
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
            if not bm.can_append(seq, upto=upto):
                # `seq` is itself the least urgent: it gives way.
                if self._max_blocks(seq) > bm.num_blocks:
                    # It outgrew the whole pool and could never be re-admitted: end it instead
                    # of parking it at the head of waiting forever.
                    self.finish(seq, "length")
                    out.finished.append(seq)
                else:
                    self._preempt(seq)
                    out.preempted.append(seq)
                break  # seq was running[-1]; nothing after it
            bm.may_append(seq, upto=upto)
            n = min(seq.num_uncomputed_tokens, budget)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1

        # 2. Admit waiting sequences. Not after a preemption in step 1: memory is tight, and the
        # just-preempted seq would be re-admitted only to be preempted again (vLLM does the same).
        if out.preempted or out.finished:
            return out
        if self.num_lookahead_tokens:
            budget = self._reserve_lookahead(out, budget)
        preempted_now: set[int] = set()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.seq_id in preempted_now or bm.waits_for_prefix(seq):
                break
            limit = budget if seq.kv_policy is not None else None
            if not bm.can_allocate(seq, limit) and not self._preempt_for(seq, out, preempted_now, limit):
                break  # no head-of-line skipping past a blocked, more urgent seq
            # Budget returned by unscheduled victims.
            budget = self.max_num_batched_tokens - out.num_batched_tokens
            del self.waiting[0]
            bm.allocate(seq, limit)
            seq.status = SequenceStatus.RUNNING
            self.running.insert(bisect.bisect_right(self.running, _rank(seq), key=_rank), seq)
            n = min(seq.num_uncomputed_tokens, budget)
            if limit is not None:  # blocks were given for `limit` tokens only
                n = min(n, len(seq.block_table) * bm.block_size - seq.num_computed_tokens)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return out

    def _reserve_lookahead(self, out: SchedulerOutput, budget: int) -> int:
        """Speculative decoding: give each decoding sequence slots for up to k draft tokens, most
        urgent first, from the budget and free blocks left after every running sequence got its
        own token. Drafts are optional work: they never preempt anything."""
        bm, bs = self.block_manager, self.block_manager.block_size
        for s in out.scheduled:
            seq = s.seq
            if budget <= 0:
                break
            if not (seq.num_lookahead_tokens and s.num_tokens == 1 and s.samples):
                continue
            room = (len(seq.block_table) + bm.num_free_blocks) * bs - seq.num_tokens
            # k drafts + the token after them make k + 1 outputs: never more than max_tokens allows
            k = min(seq.num_lookahead_tokens, budget, room, seq.params.max_tokens - seq.num_output_tokens - 1)
            if k <= 0:
                continue
            bm.may_append(seq, k)
            s.num_tokens += k
            s.num_spec_tokens = k
            budget -= k
        return budget

    def _preempt_for(self, head: Sequence, out: SchedulerOutput, preempted_now: set[int],
                     limit: int | None = None) -> bool:
        """Priority preemption: free blocks for `head` by preempting strictly less urgent running
        seqs, least urgent first. Preempts nothing unless that can actually make `head` fit."""
        bm = self.block_manager
        victims = [s for s in self.running if s.priority > head.priority]
        if not victims:
            return False
        # Blocks freed if every candidate went: those whose every reference is a candidate's.
        holders: dict[int, int] = {}
        for s in victims:
            for bid in s.block_table:
                if bid >= 0:  # -1: released by a KV policy
                    holders[bid] = holders.get(bid, 0) + 1
        freeable = {bid for bid, n in holders.items() if bm.blocks[bid].ref_count == n}
        # A hit on a block only victims hold is free today but would cost a block once they go.
        rehit = sum(1 for bid in bm.cached_prefix(head) if bid in freeable)
        if bm.num_free_blocks + len(freeable) - rehit < bm.num_blocks_to_allocate(head, limit):
            return False
        while not bm.can_allocate(head, limit):
            victim = self.running[-1]
            if victim.priority <= head.priority:  # unreachable given the check above
                return False
            for k, chunk in enumerate(out.scheduled):
                if chunk.seq is victim:  # scheduled in step 1: take its tokens back out
                    del out.scheduled[k]
                    break
            self._preempt(victim)
            out.preempted.append(victim)
            preempted_now.add(victim.seq_id)
        return True

    # ---- after the model ran ----------------------------------------------------------------

    def postprocess(self, output: SchedulerOutput, sampled: Mapping[int, int | list[int]]) -> None:
        """Advance each scheduled seq by its chunk and append the token sampled for it.

        `sampled` maps seq_id -> token id for every scheduled seq whose chunk `samples`; for a seq
        that verified drafts, the list of tokens it accepted: the drafts that passed, then the one
        token sampled after them. Afterwards a decoding seq has num_computed_tokens == num_tokens - 1.
        """
        bm = self.block_manager
        for s in output.scheduled:
            seq = s.seq
            if s.num_spec_tokens:
                seq.spec_token_ids = []
            if seq.status != SequenceStatus.RUNNING:  # aborted/finished while the step ran
                continue
            if not s.samples:
                seq.num_computed_tokens = s.end
                bm.mark_computed(seq, seq.num_computed_tokens)
                continue
            if seq.seq_id not in sampled:
                raise ValueError(f"no sampled token for {seq.request_id!r} (seq_id {seq.seq_id})")
            tokens = sampled[seq.seq_id]
            if isinstance(tokens, int):
                seq.num_computed_tokens = s.end - s.num_spec_tokens
                bm.mark_computed(seq, seq.num_computed_tokens)
                seq.append_token(tokens)
            else:
                # Accepted drafts keep the KV the step wrote for them; the rejected ones' slots lie
                # past num_computed_tokens, where nothing reads them and the next step overwrites
                # them. Hashing (mark_computed) never goes past num_computed_tokens.
                accepted = len(tokens) - 1
                if not 0 <= accepted <= s.num_spec_tokens:
                    raise ValueError(f"{len(tokens)} tokens for {s.num_spec_tokens} drafts of {seq.request_id!r}")
                seq.num_computed_tokens = s.end - s.num_spec_tokens + accepted
                seq.token_ids.extend(tokens)
                bm.mark_computed(seq, seq.num_computed_tokens)
            if seq.num_lookahead_tokens:  # slots reserved for drafts that were not accepted
                bm.free_lookahead(seq)


def _prio(seq: Sequence) -> int:
    return seq.priority
