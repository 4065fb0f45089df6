"""Speculative decoding inside continuous batching: cheap draft tokens, verified by one target forward.

Each step the scheduler reserves KV slots for up to k draft tokens of every decoding sequence that
may speculate (from the leftover token budget and free blocks; never by preempting anyone). A
proposer fills them, the target runs once over [last token, d1..dk] -- a short prefill chunk in the
same batch as everyone else's decode and prefill rows -- and the verifier keeps the drafts the
target agrees with plus one token of the target's own: 1 to k+1 tokens per forward.

Proposers:
  NgramProposer       prompt lookup: the tokens that followed the latest earlier occurrence of the
                      context's last n <= 3 tokens. No model; wins where the output copies the input.
  DraftModelProposer  self-speculation: the target's first N decoder layers + its final norm and LM
                      head (LayerSkip-style early exit). See its docstring for how it shares the KV.

Verification is lossless. p is the distribution the plain sampler draws from (penalties counting
the drafts before each position, min_tokens, temperature, top-k / top-p / min-p):
  * Point-mass drafts (n-gram; draft-model drafts of greedy requests): each position's token is
    chosen exactly as the plain sampler would (argmax, or the same exponential race with the same
    per-sequence noise), and a draft is accepted iff it equals that token. For a point mass q = 1[d]
    this is the standard rule below (accept with probability p(d), else draw from p without d), with
    the randomness coupled to the plain sampler's: greedy AND seeded outputs are token-identical to
    plain decoding.
  * Drafts sampled from a draft distribution q: accept d with probability min(1, p(d) / q(d)); at
    the first rejection draw from norm(max(0, p - q)); if all pass, draw a bonus token from p
    (Leviathan et al. 2023; gpt-fast). The output follows p exactly.
Guided (grammar) decoding falls back to plain decoding for that request; logprobs are supported
(the raw logits of every accepted position are at hand).
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Self

import torch

from mainspring.engine.attention import AttentionMetadata
from mainspring.engine.model import CausalLM
from mainspring.engine.params import SamplingParams
from mainspring.engine.sampler import _GREEDY_EPS, Sampler, SampleLogprobs, TokenMask, _index, _logprobs
from mainspring.engine.scheduler import ScheduledSeq
from mainspring.engine.sequence import Sequence
from mainspring.engine.transfers import download

METHODS = ("ngram", "draft")
DEFAULT_K = {"ngram": 10, "draft": 4}  # most draft tokens verified per step, by method
_OFF = ("", "off", "none", "0", "false")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates; validated when built, so a bad option fails at the edge."""

    method: str  # "ngram" | "draft"
    # most draft tokens verified per step (each sequence adapts below it); None: DEFAULT_K[method],
    # filled in when built, so a config always holds an int
    k: int = None  # type: ignore[assignment]
    n: int = 3  # ngram: longest suffix looked up (then n - 1, ... 1)
    # draft: how many of the target's layers it runs (0: two thirds), the bottom half and the top
    # half of that count (the middle ones are skipped), or an explicit list of layer indices
    layers: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if self.k is None:
            object.__setattr__(self, "k", DEFAULT_K[self.method])
        if isinstance(self.layers, (list, tuple)):
            object.__setattr__(self, "layers", tuple(self.layers))
            if not self.layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.layers):
                raise ValueError(f"speculative layers must be non-negative layer indices, got {list(self.layers)}")
        for name in ("k", "n") + (("layers",) if not isinstance(self.layers, tuple) else ()):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "layers" else 1):
                raise ValueError(f"speculative {name} must be a positive integer, got {v!r}")

    @classmethod
    def parse(cls, text: str) -> Self | None:
        """The MAINSPRING_SPECULATIVE syntax: "" / "off" -> None; "ngram", "ngram:k=5,n=3",
        "draft:layers=8,k=4"; or a JSON object of the fields."""
        text = text.strip()
        if text.lower() in _OFF:
            return None
        if text.startswith("{"):
            options = dict(json.loads(text))
        else:
            method, _, opts = text.partition(":")
            options = {"method": method.strip()}
            for opt in filter(None, (o.strip() for o in opts.split(","))):
                key, eq, val = opt.partition("=")
                if not eq:
                    raise ValueError(f"speculative option {opt!r} must be key=value")
                options[key.strip()] = int(val)
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"unknown speculative option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(options.pop("method", None), **options)

    def draft_layers(self, num_layers: int) -> list[int]:
        """Indices of the target layers the draft runs. Skipping the middle keeps the top layers
        that map hidden states to the vocabulary: on SmolLM2-135M, 20 of 30 layers agree with the
        target's greedy token 49% of the time as 0-9 + 20-29, 20% as 0-19 (early exit)."""
        if isinstance(self.layers, tuple):
            idx = sorted(set(self.layers))
        else:
            n = min(self.layers or (2 * num_layers + 2) // 3, num_layers)
            idx = list(range((n + 1) // 2)) + list(range(num_layers - n // 2, num_layers))
        if idx[-1] >= num_layers:
            raise ValueError(f"draft layer {idx[-1]} does not exist: the model has {num_layers}")
        return idx


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None  # [len, V] q each token was drawn from; None: point masses


class DraftView:
    """`seq` as if its first drafts were appended: what the sampler reads (penalties, min_tokens,
    seed) at a draft position. The prompt ids cache is keyed by seq_id, so it is shared."""

    __slots__ = ("seq", "draft")

    def __init__(self, seq: Sequence, draft: list[int]) -> None:
        self.seq, self.draft = seq, draft

    @property
    def params(self) -> SamplingParams:
        return self.seq.params

    @property
    def seq_id(self) -> int:
        return self.seq.seq_id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.seq.prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids + self.draft

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.draft)


# --- proposers ------------------------------------------------------------------------------------


class NgramProposer:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n = max_n
    down to 1, longest first) and propose the tokens that followed it."""

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n

    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        return [Draft(self.lookup(s.token_ids, k)) for s, k in zip(seqs, limits)]

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        size = len(token_ids)
        if k <= 0 or size < 2:
            return []
        # bytes.rfind scans in C: a search over a few thousand tokens costs microseconds. Ids are
        # 4-byte items, so only matches at offsets divisible by 4 are real.
        buf = array("i", token_ids).tobytes()
        for n in range(min(self.max_n, size - 1), 0, -1):
            pattern = buf[-4 * n :]
            end = 4 * (size - 1)  # the match must end before the last token: one token follows it
            while (at := buf.rfind(pattern, 0, end)) >= 0:
                if at % 4 == 0:
                    start = at // 4 + n
                    return token_ids[start : start + k]
                end = at + len(pattern) - 1  # misaligned: look further left
        return []


class DraftModelProposer:
    """Self-speculation: a layer-skipped variant of the target (some of its decoder layers, then
    its final norm and LM head), sharing the target's weights and tokenizer.

    KV: the draft has no cache of its own. Each draft layer reads, for the context, the K/V the
    target cached in that layer (same block table, same slots) -- for the bottom layers exactly
    what the draft would have computed, for the layers above a skipped block the target's
    better-informed K/V. It writes the K/V of the positions it drafts into the slots the
    scheduler reserved for the drafts; the verify forward overwrites them with the target's own,
    and rejected positions lie past the sequence's computed length, where nothing reads them.
    No recompute of the context, no second pool. Any draft of the same shapes (e.g. a quantized
    copy of those layers) plugs in as `model`: how well it drafts may change, the output never.
    """

    def __init__(self, model: CausalLM, kv_cache: list, block_size: int, layers: list[int], sampler: Sampler) -> None:
        self.model, self.kv_cache, self.layers = model, kv_cache, layers
        self.block_size, self.sampler = block_size, sampler
        self.device = model.embed_tokens.weight.device

    def _logits(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model.compute_logits(self.model(ids, positions, self.kv_cache, meta, layers=self.layers))

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        # Where every row is greedy and no penalty reads the drafted ids, each position's picks feed the next
        # forward on the device and all come back in one read (on a GPU, one wait per draft, not per position).
        on_device = not any(_reads_drafts(s.params) for s in seqs)
        drafts: list[list[int]] = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        device_picks: list[tuple[list[int], torch.Tensor]] = []  # (rows, their picks) per position, on_device
        for j in range(max(limits, default=0)):  # one batched draft decode step per draft position
            rows = [i for i, k in enumerate(limits) if k > j]
            if on_device and j:  # the rows still drafting are a subsequence of the previous position's
                prev_rows, prev = device_picks[-1]
                at = {i: r for r, i in enumerate(prev_rows)}
                ids = prev[_index([at[i] for i in rows], self.device)]
            else:
                ids = _index([drafts[i][-1] if j else seqs[i].last_token_id for i in rows], self.device)
            pos = [seqs[i].num_tokens - 1 + j for i in rows]
            meta = AttentionMetadata.build([(seqs[i].block_table, p + 1) for i, p in zip(rows, pos)], [],
                                           self.block_size).to(self.device)
            # on the device path the sampler reads only how many drafts there are (min_tokens), never their ids
            views = [DraftView(seqs[i], [-1] * j if on_device else drafts[i][:]) for i in rows]
            x = self.sampler.apply_penalties(self._logits(ids, _index(pos, self.device), meta), views)
            if on_device:
                device_picks.append((rows, x.argmax(dim=-1)))
                continue
            picks: list[int] = x.argmax(dim=-1).tolist()
            sampled = [r for r, v in enumerate(views) if v.params.temperature >= _GREEDY_EPS]
            if sampled:
                # A sampling request's drafts are drawn from q (the same processing as p), so the
                # verifier can use the min(1, p/q) rule, which accepts more than matching a point.
                q = self.sampler.probs(x[sampled], [views[r] for r in sampled])
                for m, r in enumerate(sampled):
                    gen = self.sampler.generator(views[r].seq, q.device)
                    picks[r] = int(torch.multinomial(q[m], 1, generator=gen))
                    qs[rows[r]].append(q[m])
            for r, i in enumerate(rows):
                drafts[i].append(picks[r])
        for (rows, _), got in zip(device_picks, download(*(p for _, p in device_picks))):
            for i, t in zip(rows, got.tolist()):
                drafts[i].append(t)
        return [Draft(d, torch.stack(q) if q else None) for d, q in zip(drafts, qs)]


def _reads_drafts(params: SamplingParams) -> bool:
    """Whether drafting for this request reads the drafted ids on the host: it samples, or a penalty counts them."""
    return params.temperature >= _GREEDY_EPS or params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 \
        or params.frequency_penalty != 0.0


# --- verification ---------------------------------------------------------------------------------


def rejection_sample(p: torch.Tensor, q: torch.Tensor, draft: list[int],
                     generator: torch.Generator | None = None) -> list[int]:
    """The standard lossless rule for drafts drawn from q. p: [k+1, V] target probabilities at
    each draft position and the one after; q: [k, V]. Returns the accepted drafts + one token."""
    k = len(draft)
    d = _index(draft, p.device)
    rows = torch.arange(k, device=p.device)
    u = torch.rand(k, generator=generator, dtype=p.dtype, device=p.device)
    accept = u * q[rows, d] < p[rows, d]  # u < p/q without dividing (q(d) > 0: d was drawn from q)
    a = int(accept.logical_not().to(torch.int8).argmax()) if not bool(accept.all()) else k
    if a == k:
        dist = p[k]
    else:
        dist = (p[a] - q[a]).clamp_(min=0.0)
        if not bool(dist.sum() > 0):  # p == q up to rounding: rejection had probability ~0
            dist = p[a]
    return draft[:a] + [int(torch.multinomial(dist, 1, generator=generator))]


class SpeculativeDecoder:
    """Owns the proposer; the engine calls propose() after scheduling and sample() on the logits."""

    def __init__(self, config: SpeculativeConfig, sampler: Sampler, model: CausalLM | None = None,
                 kv_cache: list | None = None, block_size: int = 16) -> None:
        self.config, self.sampler = config, sampler
        if config.method == "ngram":
            self.proposer: NgramProposer | DraftModelProposer = NgramProposer(config.n)
        else:
            assert model is not None and kv_cache is not None
            layers = config.draft_layers(model.config.num_hidden_layers)
            self.proposer = DraftModelProposer(model, kv_cache, block_size, layers, sampler)
        self._q: dict[int, torch.Tensor] = {}  # seq_id -> q of this step's sampled drafts
        self.num_draft_tokens = 0  # proposed and verified, since start
        self.num_accepted_tokens = 0

    @property
    def k(self) -> int:
        return self.config.k

    @staticmethod
    def supports(params: SamplingParams) -> bool:
        # a grammar's mask depends on the tokens before it: it would have to be advanced per draft;
        # a prompt-scoring request (prompt_logprobs, maybe max_tokens 0) has nothing worth drafting
        return not params.guided and params.prompt_logprobs is None

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def propose(self, scheduled: list[ScheduledSeq], max_model_len: int) -> None:
        """Fill the draft slots the scheduler reserved (fewer, or none, where nothing is proposed)."""
        todo = [s for s in scheduled if s.num_spec_tokens]
        if not todo:
            return
        # positions must stay inside the context: the draft tokens end at num_tokens - 1 + k
        limits = [max(0, min(s.num_spec_tokens, max_model_len - s.seq.num_tokens - 1)) for s in todo]
        for s, d in zip(todo, self.proposer.propose([s.seq for s in todo], limits)):
            s.set_spec_tokens(d.token_ids)
            if d.probs is not None and d.token_ids:
                self._q[s.seq.seq_id] = d.probs

    def sample(
        self, logits: torch.Tensor, seqs: list[Sequence],
        masks: Callable[[list[Sequence]], Mapping[int, TokenMask] | None],
    ) -> tuple[dict[int, list[int]], dict[int, list[SampleLogprobs | None]]]:
        """Tokens for every sequence of the step: the plain sampler for rows without drafts, the
        verifier for the others. `logits` has 1 + len(seq.spec_token_ids) rows per sequence."""
        plain_rows, plain = [], []
        spec: list[tuple[Sequence, int]] = []  # (seq, first row)
        row = 0
        for seq in seqs:
            if seq.spec_token_ids:
                spec.append((seq, row))
            else:
                plain_rows.append(row)
                plain.append(seq)
            row += 1 + len(seq.spec_token_ids)
        tokens: dict[int, list[int]] = {}
        lps: dict[int, list[SampleLogprobs | None]] = {}
        if plain:
            out = self.sampler(logits[_index(plain_rows, logits.device)], plain, masks(plain))
            for seq, t, lp in zip(plain, out.token_ids, out.logprobs):
                tokens[seq.seq_id], lps[seq.seq_id] = [t], [lp]
        if spec:
            self._verify(logits, spec, tokens, lps)
        return tokens, lps

    def _verify(self, logits: torch.Tensor, spec: list[tuple[Sequence, int]], tokens: dict[int, list[int]],
                lps: dict[int, list[SampleLogprobs | None]]) -> None:
        rows = _index([r + j for seq, r in spec for j in range(len(seq.spec_token_ids) + 1)], logits.device)
        raw = logits[rows]
        views = [DraftView(seq, seq.spec_token_ids[:j]) for seq, _ in spec for j in range(len(seq.spec_token_ids) + 1)]
        x = self.sampler.apply_penalties(raw, views)
        greedy_picks = x.argmax(dim=-1).tolist()
        at = 0
        for seq, _ in spec:
            draft, k = seq.spec_token_ids, len(seq.spec_token_ids)
            span = slice(at, at + k + 1)
            if seq.params.temperature < _GREEDY_EPS:
                out = _match(draft, greedy_picks[span])
            else:
                p = self.sampler.probs(x[span], views[span])
                q = self._q.pop(seq.seq_id, None)
                if q is None:
                    out = self._match_sampled(draft, p, views[span])
                else:
                    out = rejection_sample(p, q, draft, self.sampler.generator(seq, p.device))
            tokens[seq.seq_id] = out
            lps[seq.seq_id] = (_logprobs(raw[at : at + len(out)], out, [seq.params] * len(out))
                               if seq.params.logprobs is not None else [None] * len(out))
            self.num_draft_tokens += k
            self.num_accepted_tokens += len(out) - 1
            # Adapt the draft length: each draft token costs a slice of a forward (CPU matmuls
            # grow with the rows), so after a rejection ask only for what would have passed + 1;
            # after a fully accepted run ask for 2 more (up to k).
            seq.num_lookahead_tokens = min(self.k, k + 2) if len(out) > k else len(out)
            at += k + 1
        self._q.clear()

    def _match_sampled(self, draft: list[int], p: torch.Tensor, views: list[DraftView]) -> list[int]:
        # Position by position, the plain sampler's own draw (same noise stream: V uniforms per
        # token, from the request's generator when seeded); stop at the first disagreement.
        out: list[int] = []
        for j in range(len(draft) + 1):
            t = int(self.sampler.draw(p[j : j + 1], [views[j]])[0])
            out.append(t)
            if j == len(draft) or t != draft[j]:
                break
        return out


def _match(draft: list[int], target: list[int]) -> list[int]:
    """Greedy: drafts up to the first one that differs from the target's pick, then its pick."""
    for j, d in enumerate(draft):
        if target[j] != d:
            return draft[:j] + [target[j]]
    return draft + [target[len(draft)]]
