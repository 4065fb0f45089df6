"""One request as the engine sees it: token ids, its KV blocks and how far they are computed."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum, auto

from mainspring.engine.kv_policy import KVPolicy
from mainspring.engine.params import SamplingParams

_counter = itertools.count()


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt followed by generated tokens
    params: SamplingParams
    priority: int = 0  # lower runs first (vLLM convention)
    arrival_time: float = field(default_factory=time.monotonic)
    cache_salt: str | None = None  # isolates prefix-cache hits between tenants

    seq_id: int = field(default_factory=lambda: next(_counter))
    num_prompt_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is written in the cache
    num_cached_tokens: int = 0  # tokens of this admission served from the prefix cache
    usage_cached_tokens: int | None = None  # cached prompt tokens at first admission (billed)
    num_preemptions: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    # Speculative decoding: how many draft tokens it may verify per step (0 = plain decoding), and
    # the drafts being verified this step. Drafts are never in token_ids: only accepted tokens are.
    num_lookahead_tokens: int = 0
    spec_token_ids: list[int] = field(default_factory=list)
    # KV policy (engine/kv_policy.py): None = dense fp32. Released blocks read -1 in block_table;
    # cold_blocks maps a logical block index to its id in the quantized cold store. The cursors
    # say how far the policy has already released / demoted blocks.
    kv_policy: KVPolicy | None = None
    cold_blocks: dict[int, int] = field(default_factory=dict)
    kv_drop_from: int = 0
    kv_demote_from: int = 0
    # SnapKV: the prompt's last queries' attention per key (scores, key positions), until the
    # policy has evicted by it; kv_snapped once it has (reset when the sequence is recomputed)
    snap_scores: tuple | None = None
    kv_snapped: bool = False

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def num_blocks(self, block_size: int) -> int:
        return (len(self.token_ids) + block_size - 1) // block_size

    def block_tokens(self, i: int, block_size: int) -> list[int]:
        return self.token_ids[i * block_size : (i + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
