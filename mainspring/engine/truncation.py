"""Truncation sampling: top-k, top-p (nucleus) and min-p, which drop a row's unlikely tokens
(-inf logits) before the sampler's softmax.

All three are thresholds on the temperature-scaled logits, so they combine into one per-row cut.
Top-p avoids sorting the vocabulary: it looks at a few hundred likeliest candidates first and falls
back to a log-probability histogram for flat distributions.
"""

from __future__ import annotations

import torch

from mainspring.engine.params import SamplingParams
from mainspring.engine.transfers import upload


def apply_filters(x: torch.Tensor, params: list[SamplingParams]) -> None:
    """top-k, then top-p, then min-p, on temperature-scaled logits x [rows, V], in place.

    Each filter keeps the tokens whose logit is >= a per-row threshold, so the three combine into one
    threshold (their max) and one masked_fill: a few dense passes instead of a dozen. Ties with a
    threshold are kept (a set can exceed top_k only on exactly equal logits).
    """
    rows, vocab = x.shape
    dev, neg_inf = x.device, float("-inf")
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    k_on = upload([k > 0 for k in ks], dev).unsqueeze(1)
    thresh = torch.full((rows, 1), neg_inf, device=dev)
    max_logit: torch.Tensor | None = None
    if any(ks):
        top = x.topk(max(ks), dim=-1).values  # sorted, likeliest first
        kth = top.gather(1, upload([max(k, 1) - 1 for k in ks], dev).unsqueeze(1))
        thresh = torch.where(k_on, kth, thresh)  # the k-th largest logit; rows without top-k: -inf
        max_logit = top[:, :1]
    p_rows = [i for i, q in enumerate(params) if q.top_p < 1.0]
    if p_rows:
        p = upload([float(params[i].top_p) for i in p_rows], dev).unsqueeze(1)
        # off the CPU every token is a candidate: a sort is cheap there, and the CPU's shortcut (a histogram for
        # the rows it leaves short) would make the host wait for the device to learn which rows those are
        cand = min(vocab, max([256] + [ks[i] for i in p_rows])) if dev.type == "cpu" else vocab
        all_k = all(ks[i] for i in p_rows)
        if len(p_rows) == rows:  # no row copies in the common all-rows case
            thresh = torch.maximum(thresh, _top_p_thresholds(x, thresh, k_on, p, cand, all_k))
        else:
            idx = upload(p_rows, dev, torch.long)
            thresh[idx] = torch.maximum(thresh[idx], _top_p_thresholds(x[idx], thresh[idx], k_on[idx], p, cand,
                                                                       all_k))
    min_ps = [float(q.min_p) for q in params]
    if any(m > 0.0 for m in min_ps):
        # prob < min_p * max_prob  <=>  logit < max_logit + log(min_p); log(0) = -inf turns it off.
        if max_logit is None:
            max_logit = x.amax(dim=-1, keepdim=True)
        thresh = torch.maximum(thresh, max_logit + upload(min_ps, dev).log().unsqueeze(1))
    x.masked_fill_(x < thresh, neg_inf)


def _top_p_thresholds(
    x: torch.Tensor, k_thresh: torch.Tensor, k_on: torch.Tensor, p: torch.Tensor, cand: int, all_k: bool
) -> torch.Tensor:
    """Per row, the logit of the last token of the nucleus: the smallest set of likeliest tokens
    whose mass reaches p (a token stays iff the mass strictly likelier than it is < p, so the
    likeliest always stays), under the distribution renormalized after top-k.

    Sorting the whole vocab is slow on CPU (~15x a small topk) and a nucleus is usually a few dozen
    tokens, so this looks at the `cand` likeliest tokens first: tokens past them have at least the
    candidates' whole mass before them, so once that reaches p they are all dropped, exactly as a
    full sort drops them. Rows with a wider nucleus (flat distributions) go to _top_p_histogram.
    """
    top = x.topk(cand, dim=-1).values  # sorted, likeliest first
    cut = top.masked_fill(top < k_thresh, float("-inf"))
    # A top-k row's kept tokens are all candidates (cand >= k), so it normalizes over them.
    lse_k = torch.logsumexp(cut, dim=-1, keepdim=True)
    # every token a candidate: the rows without top-k normalize over them all too
    lse = lse_k if all_k or cand == x.shape[1] else torch.where(k_on, lse_k, torch.logsumexp(x, dim=-1, keepdim=True))
    probs = (cut - lse).exp()
    mass = probs.cumsum(dim=-1)
    n_keep = ((mass - probs) < p).sum(dim=-1, keepdim=True).clamp_(1, cand)
    out = top.gather(1, n_keep - 1)
    if cand < x.shape[1]:
        short = (mass[:, -1] < p[:, 0]).nonzero().squeeze(1)
        if short.numel() == x.shape[0]:
            out = _top_p_histogram(x, k_thresh, p)
        elif short.numel():
            out[short] = _top_p_histogram(x[short], k_thresh[short], p[short])
    return out


# Histogram buckets of log-probability below the row max, 1/64 nat wide; anything lower than 32
# nats below the max (relative prob < 1e-14) shares the last bucket.
_BUCKETS, _BUCKET_RANGE = 2048, 32.0


def _top_p_histogram(x: torch.Tensor, k_thresh: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """_top_p_thresholds for wide nuclei without a full sort: bucket the probability mass by
    log-probability, find the bucket where the running mass crosses p, and sort only that bucket's
    tokens (every token in a bucket above it is kept, every token in one below it dropped)."""
    neg_inf = float("-inf")
    if bool(k_thresh.isfinite().any()):
        x = x.masked_fill(x < k_thresh, neg_inf)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    probs = (x - lse).exp()
    bucket = (x.amax(dim=-1, keepdim=True) - x).mul_(_BUCKETS / _BUCKET_RANGE).clamp_(max=_BUCKETS - 1).long()
    mass = torch.zeros(x.shape[0], _BUCKETS, device=x.device).scatter_add_(1, bucket, probs)
    running = mass.cumsum(dim=-1)
    crossing = (running < p).sum(dim=-1, keepdim=True).clamp_(max=_BUCKETS - 1)
    mass_before_bucket = (running - mass).gather(1, crossing)
    in_bucket = bucket == crossing
    # At least one column: a row whose mass never reaches p (rounding, p ~ 1) gets -inf: keep all.
    width = max(1, int(in_bucket.sum(dim=-1).max()))
    vals = x.masked_fill(~in_bucket, neg_inf).topk(width, dim=-1).values
    pv = (vals - lse).exp()
    n_keep = ((mass_before_bucket + pv.cumsum(dim=-1) - pv) < p).sum(dim=-1, keepdim=True)
    return vals.gather(1, n_keep.clamp_(1, vals.shape[1]) - 1)
