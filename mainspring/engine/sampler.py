"""Turns one decode step's logits into next tokens, per request: penalties, min_tokens, greedy or
temperature + top-k/top-p/min-p sampling, per-request seeds, and logprobs of the raw distribution.

Everything is vectorized over the batch; work that only some rows need (penalties, filters, seeded
noise, logprobs) runs on the sub-batch of those rows, so an all-greedy or all-default batch costs a
few full passes over [B, V] and no per-row tensor work.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence as SequenceABC
from dataclasses import dataclass
from itertools import chain

import torch

from mainspring.engine.params import SamplingParams
from mainspring.engine.sequence import Sequence

# torch.Generator.manual_seed takes 64 bits; OpenAI-style seeds are arbitrary ints, so fold them.
_SEED_MASK = (1 << 64) - 1
_TINY = torch.finfo(torch.float32).tiny
# Temperatures this small are greedy in all but name, and dividing logits by them can overflow (vLLM
# uses the same cut-off).
_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SampleLogprobs:
    """Log-probabilities of one sampled token under the model's raw distribution (log_softmax of
    the logits before penalties and temperature, as OpenAI and vLLM report them)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob) of the params.logprobs likeliest, likeliest first


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[SampleLogprobs | None]  # None where the row's params.logprobs is None


class Sampler:
    """Stateless except for one torch.Generator per seeded sequence (created on its first step)."""

    def __init__(self, eos_token_ids: Iterable[int] = ()) -> None:
        self.eos_token_ids: list[int] = list(eos_token_ids)
        self._generators: dict[int, torch.Generator] = {}

    def free(self, seq_id: int) -> None:
        """Drop a finished sequence's generator; call once when the request ends (any reason)."""
        self._generators.pop(seq_id, None)

    @property
    def num_seeded(self) -> int:
        return len(self._generators)

    def __call__(self, logits: torch.Tensor, seqs: SequenceABC[Sequence]) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"logits must be [len(seqs)={len(seqs)}, vocab], got {tuple(logits.shape)}")
        raw = logits
        params = [s.params for s in seqs]
        num_rows = logits.shape[0]
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
        token_ids: list[int] = tokens.tolist()
        return SamplerOutput(token_ids, _logprobs(raw, token_ids, params))

    def apply_penalties(self, logits: torch.Tensor, seqs: SequenceABC[Sequence]) -> torch.Tensor:
        """Steps 1-2 as fp32 logits: repetition / presence / frequency penalties, then EOS and
        stop_token_ids masked (-inf) for rows still below min_tokens. Never edits `logits` itself."""
        params = [s.params for s in seqs]
        logits = logits.float()
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        pf_rows = [i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
        min_tok_rows = [i for i, s in enumerate(seqs) if s.num_output_tokens < s.params.min_tokens]
        if not (rep_rows or pf_rows or min_tok_rows):
            return logits
        # A contiguous copy: the caller's tensor keeps the raw logits (logprobs need them), and the
        # penalty helpers edit it through x.view(-1).
        logits = logits.clone(memory_format=torch.contiguous_format)
        if rep_rows:
            _apply_repetition_penalty(logits, rep_rows, seqs)
        if pf_rows:
            _apply_presence_frequency(logits, pf_rows, seqs)
        if min_tok_rows:
            self._mask_stop_tokens(logits, min_tok_rows, params)
        return logits

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
            logits[torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev)] = float("-inf")

    # --- sampling -------------------------------------------------------------------------------

    def _sample(self, logits: torch.Tensor, rows: list[int], seqs: SequenceABC[Sequence]) -> torch.Tensor:
        dev = logits.device
        all_rows = len(rows) == logits.shape[0]
        x = logits if all_rows else logits[_index(rows, dev)]
        params = [seqs[r].params for r in rows]

        # Temperature (rows below _GREEDY_EPS were routed to argmax, so the division stays finite).
        temps = [float(p.temperature) for p in params]
        owned = not all_rows  # indexing made a copy we may edit in place
        if any(t != 1.0 for t in temps):
            x = x / torch.tensor(temps, device=dev, dtype=x.dtype).unsqueeze(1)
            owned = True

        vocab = x.shape[1]
        f_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0]
        if f_rows:
            if not owned:
                x = x.clone()  # never edit the caller's logits
            if len(f_rows) == len(rows):
                _apply_filters(x, params)
            else:
                f_idx = _index(f_rows, dev)
                sub = x[f_idx]
                _apply_filters(sub, [params[i] for i in f_rows])
                x[f_idx] = sub

        # Exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) picks i with probability p_i. Unlike
        # torch.multinomial over the batch, each row consumes exactly V draws from its own noise, so a
        # seeded row's tokens depend only on its generator, never on the other rows in the batch.
        # E = -log(U) is drawn by inversion (uniform_ + log_ is ~3x cheaper than exponential_ on CPU)
        # and kept as log(U) = -E, so argmax p/E = argmin p/log(U). U in [tiny, 1) keeps log(U)
        # finite and < 0: every p > 0 scores < 0 and every masked p = 0 scores 0, so is never chosen.
        probs = torch.softmax(x, dim=-1)
        noise = torch.empty_like(probs)
        seeded = [(i, seqs[r]) for i, r in enumerate(rows) if seqs[r].params.seed is not None]
        if len(seeded) < len(rows):
            noise.uniform_(_TINY, 1.0)  # unseeded rows share the global RNG
        for i, seq in seeded:
            noise[i].uniform_(_TINY, 1.0, generator=self._generator(seq, dev))
        return probs.div_(noise.log_()).argmin(dim=-1)

    def _generator(self, seq: Sequence, device: torch.device) -> torch.Generator:
        gen = self._generators.get(seq.seq_id)
        if gen is None:
            gen = torch.Generator(device=device)
            gen.manual_seed(int(seq.params.seed) & _SEED_MASK)
            self._generators[seq.seq_id] = gen
        return gen


# --- helpers: each edits rows `rows` of `x` in place ----------------------------------------------


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, device=device, dtype=torch.long)


def _flat_token_index(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """Positions in the flattened [len(token_lists), vocab] logits, one per (row, token) occurrence.
    One tensor is built for all rows instead of one per row; ids outside the vocab are dropped."""
    lengths = torch.tensor([len(t) for t in token_lists], device=device)
    flat = torch.tensor(list(chain.from_iterable(token_lists)), device=device, dtype=torch.long)
    row = torch.repeat_interleave(torch.arange(len(token_lists), device=device), lengths)
    keep = (flat >= 0) & (flat < vocab)
    return (row * vocab + flat)[keep]


# Penalties touch only the logits of tokens that occurred: O(tokens of the penalized rows), never a
# dense [rows, vocab] pass. `x` is contiguous (the caller cloned it), so x.view(-1) aliases it.


def _apply_repetition_penalty(x: torch.Tensor, rows: list[int], seqs: SequenceABC[Sequence]) -> None:
    # CTRL / HF: every token seen in prompt or output is made less likely whatever its sign, so
    # positive logits are divided and negative ones multiplied by the penalty (once per token).
    dev, vocab = x.device, x.shape[1]
    local = torch.unique(_flat_token_index([seqs[r].token_ids for r in rows], vocab, dev))
    flat_x = x.view(-1)
    pos = torch.tensor(rows, device=dev)[local // vocab] * vocab + local % vocab
    pen = torch.tensor([float(seqs[r].params.repetition_penalty) for r in rows], device=dev)[local // vocab]
    vals = flat_x[pos]
    flat_x[pos] = torch.where(vals > 0, vals / pen, vals * pen)


def _apply_presence_frequency(x: torch.Tensor, rows: list[int], seqs: SequenceABC[Sequence]) -> None:
    # OpenAI: over OUTPUT tokens only, logit -= presence * (count > 0) + frequency * count. The
    # frequency term is a scatter_add of -frequency per occurrence; presence once per distinct token.
    dev, vocab = x.device, x.shape[1]
    local = _flat_token_index([seqs[r].output_token_ids for r in rows], vocab, dev)
    if local.numel() == 0:
        return
    flat_x = x.view(-1)
    row_ids = torch.tensor(rows, device=dev)
    pres = torch.tensor([float(seqs[r].params.presence_penalty) for r in rows], device=dev)
    freq = torch.tensor([float(seqs[r].params.frequency_penalty) for r in rows], device=dev)
    pos = row_ids[local // vocab] * vocab + local % vocab
    flat_x.scatter_add_(0, pos, -freq[local // vocab])
    distinct = torch.unique(local)
    flat_x[row_ids[distinct // vocab] * vocab + distinct % vocab] -= pres[distinct // vocab]


def _apply_filters(x: torch.Tensor, params: list[SamplingParams]) -> None:
    """top-k, then top-p, then min-p, on temperature-scaled logits x [rows, V], in place.

    Each filter keeps the tokens whose logit is >= a per-row threshold, so the three combine into one
    threshold (their max) and one masked_fill: a few dense passes instead of a dozen. Ties with a
    threshold are kept (a set can exceed top_k only on exactly equal logits).
    """
    rows, vocab = x.shape
    dev, neg_inf = x.device, float("-inf")
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    use_k, use_p = any(ks), any(p.top_p < 1.0 for p in params)
    thresh = torch.full((rows, 1), neg_inf, device=dev)
    top: torch.Tensor | None = None
    if use_k or use_p:
        k_on = torch.tensor([k > 0 for k in ks], device=dev).unsqueeze(1)
        p = torch.tensor([float(q.top_p) for q in params], device=dev).unsqueeze(1)
        # Sorting the whole vocab is the slow part (~10x a topk on CPU) and a nucleus is usually a
        # few dozen tokens, so work on the `cand` likeliest tokens and widen only while some row's
        # nucleus may not fit: tokens past the candidates have at least the candidates' whole mass
        # before them, so once that reaches p they are all dropped, just as a full sort drops them.
        cand = min(vocab, max(max(ks), 256 if use_p else 0))
        lse_full = torch.logsumexp(x, dim=-1, keepdim=True) if use_p else None
        while True:
            top = x.topk(cand, dim=-1).values  # sorted, likeliest first
            if use_k:  # the k-th largest logit; off rows keep -inf
                kth = top.gather(1, torch.tensor([max(k, 1) - 1 for k in ks], device=dev).unsqueeze(1))
                thresh = torch.where(k_on, kth, thresh)
            if not use_p:
                break
            # top-p sees the top-k-renormalized distribution. A top-k row's kept tokens are all
            # candidates, so its normalizer is over the candidates; other rows use the full row.
            cut = top.masked_fill(top < thresh, neg_inf)
            lse = torch.where(k_on, torch.logsumexp(cut, dim=-1, keepdim=True), lse_full)
            probs = (cut - lse).exp()
            mass = probs.cumsum(dim=-1)
            if cand == vocab or bool(((mass[:, -1:] >= p) | (p >= 1.0)).all()):
                break
            cand = min(vocab, cand * 8)
        if use_p:
            # A token stays iff the mass strictly likelier than it is < p: a prefix of the sorted
            # candidates, never empty. Its last token's logit is the threshold.
            n_keep = ((mass - probs) < p).sum(dim=-1, keepdim=True).clamp_(1, cand)
            p_thresh = top.gather(1, n_keep - 1)
            thresh = torch.maximum(thresh, torch.where(p < 1.0, p_thresh, neg_inf))
    min_ps = [float(q.min_p) for q in params]
    if any(m > 0.0 for m in min_ps):
        # prob < min_p * max_prob  <=>  logit < max_logit + log(min_p); log(0) = -inf turns it off.
        max_logit = top[:, :1] if top is not None else x.amax(dim=-1, keepdim=True)
        thresh = torch.maximum(thresh, max_logit + torch.tensor(min_ps, device=dev).log().unsqueeze(1))
    x.masked_fill_(x < thresh, neg_inf)


def _logprobs(raw: torch.Tensor, token_ids: list[int], params: list[SamplingParams]) -> list[SampleLogprobs | None]:
    out: list[SampleLogprobs | None] = [None] * len(params)
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    dev = raw.device
    lp = torch.log_softmax(raw[_index(rows, dev)].float(), dim=-1)
    chosen_ids = torch.tensor([token_ids[r] for r in rows], device=dev)
    chosen = lp.gather(1, chosen_ids.unsqueeze(1)).squeeze(1).tolist()
    k = min(max(params[r].logprobs or 0 for r in rows), lp.shape[1])
    top_vals: list[list[float]] = [[] for _ in rows]
    top_ids: list[list[int]] = [[] for _ in rows]
    if k > 0:
        top = lp.topk(k, dim=-1)  # sorted, likeliest first
        top_vals, top_ids = top.values.tolist(), top.indices.tolist()
    for j, r in enumerate(rows):
        kr = params[r].logprobs or 0
        out[r] = SampleLogprobs(token_ids[r], chosen[j], list(zip(top_ids[j][:kr], top_vals[j][:kr])))
    return out
