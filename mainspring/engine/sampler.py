"""Turns one decode step's logits into next tokens, per request: penalties, logit_bias, min_tokens,
greedy or temperature + top-k/top-p/min-p sampling (the truncation itself: engine/truncation.py),
per-request seeds, and logprobs of the raw distribution.

Everything is vectorized over the batch; work that only some rows need (penalties, filters, seeded
noise, logprobs) runs on the sub-batch of those rows, so an all-greedy or all-default batch costs a
few full passes over [B, V] and no per-row tensor work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence as SequenceABC
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple, Protocol

import torch

from mainspring.engine.grammar import apply_bitmask_, bitmask_words
from mainspring.engine.params import SamplingParams
from mainspring.engine.transfers import download, upload
from mainspring.engine.truncation import apply_filters


# torch.Generator.manual_seed takes 64 bits; OpenAI-style seeds are arbitrary ints, so fold them.
_SEED_MASK = (1 << 64) - 1
_TINY = torch.finfo(torch.float32).tiny
# Temperatures this small are greedy in all but name, and dividing logits by them can overflow (vLLM
# uses the same cut-off).
_GREEDY_EPS = 1e-5


class SampledSeq(Protocol):
    """What the sampler reads of a sequence: a `Sequence`, or speculative's `DraftView` of one."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def seq_id(self) -> int: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def num_output_tokens(self) -> int: ...


class SampleLogprobs(NamedTuple):
    """Log-probabilities of one sampled token under the model's raw distribution (log_softmax of
    the logits before penalties and temperature, as OpenAI and vLLM report them). A tuple, so
    `chosen, top = sample_logprobs` works; the token itself is SamplerOutput.token_ids[row]."""

    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob) of the params.logprobs likeliest, likeliest first


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[SampleLogprobs | None]  # None where the row's params.logprobs is None


class TokenMask(Protocol):
    """A row's allowed next tokens (engine/grammar.py GrammarMatcher): writes an int32 bitmask row."""

    def fill_mask(self, row: torch.Tensor) -> None: ...


class Sampler:
    """Per-sequence state, keyed by seq_id and dropped by free(): a torch.Generator for each seeded
    sequence, and the distinct prompt token ids of each sequence with a repetition penalty (the
    prompt never changes, so long prompts are converted to a tensor once, not every step)."""

    def __init__(self, eos_token_ids: Iterable[int] = ()) -> None:
        self.eos_token_ids: list[int] = list(eos_token_ids)
        self._generators: dict[int, torch.Generator] = {}
        self._prompt_ids: dict[int, torch.Tensor] = {}

    def free(self, seq_id: int) -> None:
        """Drop a finished sequence's state; call once when the request ends (any reason)."""
        self._generators.pop(seq_id, None)
        self._prompt_ids.pop(seq_id, None)

    @property
    def num_seeded(self) -> int:
        return len(self._generators)

    def __call__(self, logits: torch.Tensor, seqs: SequenceABC[SampledSeq],
                 masks: Mapping[int, TokenMask] | None = None) -> SamplerOutput:
        """`masks` maps a row to its constraint (guided decoding): tokens it disallows get -inf
        before penalties, temperature and filters, so greedy and sampling only pick allowed tokens;
        logprobs still come from the raw logits."""
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits must be [len(seqs)={len(seqs)}, vocab], got {tuple(logits.shape)}")
        raw = logits
        params = [s.params for s in seqs]
        num_rows = logits.shape[0]
        if masks:
            logits = _apply_masks(logits, masks)
        logits = self.apply_penalties(logits, seqs)

        sample_rows = [i for i, p in enumerate(params) if p.temperature >= _GREEDY_EPS]
        if not sample_rows:
            tokens = logits.argmax(dim=-1)
        else:
            sampled = self._sample(logits, sample_rows, seqs)
            if len(sample_rows) == num_rows:
                tokens = sampled
            else:
                tokens = logits.argmax(dim=-1)
                tokens[_index(sample_rows, logits.device)] = sampled
        # the step's one read of the device: its tokens, with the logprobs asked for
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        ks = [params[r].logprobs or 0 for r in lp_rows]
        lp_index = _index(lp_rows, raw.device) if lp_rows else None
        on_device = _score(raw[lp_index], tokens[lp_index], ks) if lp_index is not None else ()
        host_tokens, *scored = download(tokens, *on_device)
        token_ids: list[int] = host_tokens.tolist()
        logprobs: list[SampleLogprobs | None] = [None] * num_rows
        for r, lp in zip(lp_rows, _sample_logprobs(scored, ks)):
            logprobs[r] = lp
        return SamplerOutput(token_ids, logprobs)

    def apply_penalties(self, logits: torch.Tensor, seqs: SequenceABC[SampledSeq]) -> torch.Tensor:
        """Steps 1-2 as fp32 logits: repetition / presence / frequency penalties and logit_bias, then
        EOS and stop_token_ids masked (-inf) for rows still below min_tokens. Never edits `logits`
        itself."""
        params = [s.params for s in seqs]
        logits = logits.float()
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        pf_rows = [i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
        min_tok_rows = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens]
        bias_rows = [i for i, p in enumerate(params) if p.logit_bias]
        if not (rep_rows or pf_rows or bias_rows or min_tok_rows):
            return logits
        # A contiguous copy: the caller's tensor keeps the raw logits (logprobs need them), and the
        # penalty helpers edit it through x.view(-1).
        logits = logits.clone(memory_format=torch.contiguous_format)
        dev = logits.device
        if rep_rows:
            seen = [
                torch.cat([self._distinct_prompt_ids(seqs[r], dev), _ids(seqs[r].output_token_ids, dev)])
                for r in rep_rows
            ]
            pens = [float(params[r].repetition_penalty) for r in rep_rows]
            _apply_repetition_penalty(logits, rep_rows, seen, pens)
        if pf_rows:
            outputs = [_ids(seqs[r].output_token_ids, dev) for r in pf_rows]
            pres = [float(params[r].presence_penalty) for r in pf_rows]
            freq = [float(params[r].frequency_penalty) for r in pf_rows]
            _apply_presence_frequency(logits, pf_rows, outputs, pres, freq)
        if bias_rows:
            _apply_logit_bias(logits, [(r, params[r].logit_bias) for r in bias_rows])  # type: ignore[misc]
        if min_tok_rows:
            self._mask_stop_tokens(logits, min_tok_rows, params)
        return logits

    def _distinct_prompt_ids(self, seq: SampledSeq, device: torch.device) -> torch.Tensor:
        ids = self._prompt_ids.get(seq.seq_id)
        if ids is None:
            ids = _ids(sorted(set(seq.prompt_token_ids)), device)  # on the host: unique() on a GPU waits for it
            self._prompt_ids[seq.seq_id] = ids
        return ids

    # --- min_tokens -----------------------------------------------------------------------------

    def _mask_stop_tokens(self, logits: torch.Tensor, rows: list[int], params: list[SamplingParams]) -> None:
        # Below min_tokens the request must not end: EOS and its stop_token_ids get zero probability.
        # ignore_eos does not matter here; masking EOS is harmless when it would be ignored anyway.
        vocab = logits.shape[1]
        r_idx: list[int] = []
        t_idx: list[int] = []
        for r in rows:
            banned = {t for t in chain(self.eos_token_ids, params[r].stop_token_ids) if 0 <= t < vocab}
            r_idx.extend([r] * len(banned))
            t_idx.extend(banned)
        if r_idx:
            dev = logits.device
            logits[_index(r_idx, dev), _index(t_idx, dev)] = float("-inf")

    # --- sampling -------------------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, rows: list[int], seqs: SequenceABC[SampledSeq]) -> torch.Tensor:
        return self.draw(self._probs(logits, rows, seqs), [seqs[r] for r in rows])

    def probs(self, logits: torch.Tensor, seqs: SequenceABC[SampledSeq]) -> torch.Tensor:
        """The distribution each row samples from: softmax after temperature and top-k / top-p /
        min-p, of logits that apply_penalties already processed. Every row must sample
        (temperature >= _GREEDY_EPS). Speculative decoding verifies drafts against exactly this."""
        return self._probs(logits, list(range(len(seqs))), seqs)

    def _probs(self, logits: torch.Tensor, rows: list[int], seqs: SequenceABC[SampledSeq]) -> torch.Tensor:
        dev = logits.device
        all_rows = len(rows) == logits.shape[0]
        x = logits if all_rows else logits[_index(rows, dev)]
        params = [seqs[r].params for r in rows]

        # Temperature (rows below _GREEDY_EPS were routed to argmax, so the division stays finite).
        temps = [float(p.temperature) for p in params]
        owned = not all_rows  # indexing made a copy we may edit in place
        if any(t != 1.0 for t in temps):
            x = x / upload(temps, dev, x.dtype).unsqueeze(1)
            owned = True

        vocab = x.shape[1]
        f_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0]
        if f_rows:
            if not owned:
                x = x.clone()  # never edit the caller's logits
            if len(f_rows) == len(rows):
                apply_filters(x, params)
            else:
                f_idx = _index(f_rows, dev)
                sub = x[f_idx]
                apply_filters(sub, [params[i] for i in f_rows])
                x[f_idx] = sub
        return torch.softmax(x, dim=-1)

    def draw(self, probs: torch.Tensor, seqs: SequenceABC[SampledSeq]) -> torch.Tensor:
        """One token per row of `probs` (consumed: divided in place), with each seeded row's noise
        from its own generator: V uniforms per row, so a seeded sequence's tokens depend only on
        its seed and its distributions."""
        # Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with probability p_i. Unlike
        # torch.multinomial over the batch, each row consumes exactly V draws from its own noise, so a
        # seeded row's tokens depend only on its generator, never on the other rows in the batch.
        # E = -log(U) is drawn by inversion (uniform_ + log_ is ~3x cheaper than exponential_ on CPU)
        # and kept as log(U) = -E, so argmax p/E = argmin p/log(U). U in [tiny, 1) keeps log(U)
        # finite and < 0: every p > 0 scores < 0 and every masked p = 0 scores 0, so is never chosen.
        dev = probs.device
        noise = torch.empty_like(probs)
        seeded = [(i, s) for i, s in enumerate(seqs) if s.params.seed is not None]
        if len(seeded) < len(seqs):
            noise.uniform_(_TINY, 1.0)  # unseeded rows share the global RNG
        for i, seq in seeded:
            noise[i].uniform_(_TINY, 1.0, generator=self._generator(seq, dev))
        return probs.div_(noise.log_()).argmin(dim=-1)

    def generator(self, seq: SampledSeq, device: torch.device | str = "cpu") -> torch.Generator | None:
        """The seeded sequence's generator (None when unseeded: the global RNG)."""
        return self._generator(seq, torch.device(device)) if seq.params.seed is not None else None

    def _generator(self, seq: SampledSeq, device: torch.device) -> torch.Generator:
        gen = self._generators.get(seq.seq_id)
        if gen is None:
            seed = seq.params.seed
            assert seed is not None  # only seeded sequences get their own generator
            gen = torch.Generator(device=device)
            gen.manual_seed(int(seed) & _SEED_MASK)
            self._generators[seq.seq_id] = gen
        return gen


# --- helpers ------------------------------------------------------------------------------------


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return upload(rows, device, torch.long)


def _ids(token_ids: list[int], device: torch.device) -> torch.Tensor:
    return upload(token_ids, device, torch.long)


def _apply_masks(logits: torch.Tensor, masks: Mapping[int, TokenMask]) -> torch.Tensor:
    """fp32 copy of `logits` with each masked row's disallowed tokens at -inf (the raw logits stay
    intact for logprobs). One bitmask for all masked rows, unpacked and applied in one pass."""
    rows = sorted(masks)
    bitmask = torch.empty(len(rows), bitmask_words(logits.shape[1]), dtype=torch.int32)
    for j, r in enumerate(rows):
        masks[r].fill_mask(bitmask[j])
    bitmask = upload(bitmask, logits.device)
    out = logits.float().clone(memory_format=torch.contiguous_format)
    if len(rows) == out.shape[0]:
        apply_bitmask_(out, bitmask)
    else:
        idx = _index(rows, out.device)
        sub = out[idx]
        apply_bitmask_(sub, bitmask)
        out[idx] = sub
    return out


def _flat_positions(
    rows: list[int], token_rows: list[torch.Tensor], vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (row j, token) occurrence: its position in the flattened logits, and j (the index
    into `rows`), built with one cat for all rows. Ids outside the vocab are dropped."""
    dev = token_rows[0].device
    sizes = [t.numel() for t in token_rows]
    j = torch.repeat_interleave(torch.arange(len(rows), device=dev), upload(sizes, dev), output_size=sum(sizes))
    tok = torch.cat(token_rows)
    # Ids come from the tokenizer and this sampler, so they are in range (the engine checks prompts); on the CPU
    # checking is two cheap reductions, filtering (a boolean index) is not, so filter only when needed. Off the
    # CPU both would make the host wait for the device.
    if dev.type == "cpu" and tok.numel() and (int(tok.min()) < 0 or int(tok.max()) >= vocab):
        keep = (tok >= 0) & (tok < vocab)
        j, tok = j[keep], tok[keep]
    return _index(rows, dev)[j] * vocab + tok, j


# Penalties touch only the logits of tokens that occurred: O(tokens of the penalized rows), never a
# dense [rows, vocab] pass. `x` is contiguous (apply_penalties cloned it), so x.view(-1) aliases it.
# A token occurring several times gives duplicate positions; `flat[pos] = f(flat[pos])` gathers all
# values before writing, so every duplicate writes the same value and f applies once (no unique()).


def _apply_repetition_penalty(
    x: torch.Tensor, rows: list[int], seen: list[torch.Tensor], pens: list[float]
) -> None:
    # CTRL / HF: every token seen in prompt or output is made less likely whatever its sign, so
    # positive logits are divided and negative ones multiplied by the penalty (once per token).
    pos, j = _flat_positions(rows, seen, x.shape[1])
    flat_x = x.view(-1)
    pen = upload(pens, x.device)[j]
    vals = flat_x[pos]
    flat_x[pos] = torch.where(vals > 0, vals / pen, vals * pen)


def _apply_presence_frequency(
    x: torch.Tensor, rows: list[int], outputs: list[torch.Tensor], pres: list[float], freq: list[float]
) -> None:
    # OpenAI: over OUTPUT tokens only, logit -= presence * (count > 0) + frequency * count: presence
    # once per distinct token (see above), then frequency as a scatter_add once per occurrence.
    pos, j = _flat_positions(rows, outputs, x.shape[1])
    if pos.numel() == 0:
        return
    flat_x = x.view(-1)
    flat_x[pos] = flat_x[pos] - upload(pres, x.device)[j]
    flat_x.scatter_add_(0, pos, -upload(freq, x.device)[j])


def _apply_logit_bias(x: torch.Tensor, rows: list[tuple[int, dict[int, float]]]) -> None:
    # OpenAI: the bias is added to the logit; a token the grammar masked stays at -inf whatever its
    # bias. Keys are unique per row, so one indexed add touches each (row, token) once.
    r_idx = [r for r, bias in rows for _ in bias]
    t_idx = [t for _, bias in rows for t in bias]
    vals = [float(v) for _, bias in rows for v in bias.values()]
    dev = x.device
    x[_index(r_idx, dev), _index(t_idx, dev)] += upload(vals, dev, x.dtype)


def _logprobs(
    raw: torch.Tensor, token_ids: list[int], params: list[SamplingParams]
) -> list[SampleLogprobs | None]:
    """The logprobs each row's params ask for, of its token in `token_ids` (None where not asked)."""
    out: list[SampleLogprobs | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if rows:
        scored = score_tokens(raw[_index(rows, raw.device)], [token_ids[r] for r in rows],
                              [params[r].logprobs or 0 for r in rows])
        for r, lp in zip(rows, scored):
            out[r] = lp
    return out


def score_tokens(logits: torch.Tensor, token_ids: list[int], ks: list[int]) -> list[SampleLogprobs]:
    """Row i's log-probability of token_ids[i] under log_softmax(logits[i]), with its ks[i] likeliest
    tokens (also what prompt_logprobs reports for the prompt's tokens)."""
    return _sample_logprobs(download(*_score(logits, _ids(token_ids, logits.device), ks)), ks)


def _score(logits: torch.Tensor, tokens: torch.Tensor, ks: list[int]) -> tuple[torch.Tensor, ...]:
    """score_tokens on the device: each row's chosen logprob [R], then its likeliest logprobs and ids [R, k]."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    k = min(max(ks, default=0), lp.shape[1])
    if k == 0:
        return (chosen,)
    top = lp.topk(k, dim=-1)  # sorted, likeliest first
    return chosen, top.values, top.indices


def _sample_logprobs(scored: SequenceABC[torch.Tensor], ks: list[int]) -> list[SampleLogprobs]:
    if not ks:
        return []
    chosen = scored[0].tolist()
    top_vals, top_ids = (scored[1].tolist(), scored[2].tolist()) if len(scored) > 1 else ([[]] * len(ks),) * 2
    return [SampleLogprobs(chosen[j], list(zip(top_ids[j][:kr], top_vals[j][:kr]))) for j, kr in enumerate(ks)]
