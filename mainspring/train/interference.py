"""Combining per-domain gradients into one update: PCGrad and CAGrad.

Both need one gradient per domain, materialised (a backward per domain). After a single combined
backward there is only the sum left, and projecting it against itself changes nothing: that is the
silent no-op of pitfall 5 in shared/notes/rl.md, so these functions take the per-domain vectors and
refuse fewer than two.

Gradients are flat 1-D tensors (one per domain, the same length); the result is in the convention
of the mean over domains, so a run can switch between modes without retuning the learning rate.
"""

from __future__ import annotations

import torch


def _check(grads: list[torch.Tensor]) -> torch.Tensor:
    if len(grads) < 2:
        raise ValueError("gradient surgery needs one gradient per domain (at least two); "
                         "with a single combined gradient it would silently do nothing")
    g = torch.stack([x.double() for x in grads])
    if g.dim() != 2:
        raise ValueError("gradients must be flat vectors of equal length")
    return g


def pcgrad(grads: list[torch.Tensor], generator: torch.Generator | None = None) -> torch.Tensor:
    """Yu et al. 2020: each domain's gradient is projected onto the normal plane of every other
    domain's gradient it conflicts with (negative dot product), in a random order; the projected
    gradients are averaged."""
    g = _check(grads)
    k = g.shape[0]
    out = g.clone()
    sq = (g * g).sum(1)
    for i in range(k):
        for j in torch.randperm(k, generator=generator).tolist():
            if j == i or sq[j] == 0:
                continue
            dot = out[i] @ g[j]
            if dot < 0:
                out[i] -= dot / sq[j] * g[j]
    return out.mean(0).to(grads[0].dtype)


def _simplex_projection(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection onto {w >= 0, sum w = 1} (Duchi et al. 2008)."""
    u, _ = torch.sort(v, descending=True)
    css = u.cumsum(0) - 1
    idx = torch.arange(1, len(v) + 1, dtype=v.dtype)
    rho = int((u - css / idx > 0).nonzero().max())
    return (v - css[rho] / (rho + 1)).clamp_min(0)


def cagrad(grads: list[torch.Tensor], c: float = 0.5, iters: int = 500) -> torch.Tensor:
    """Liu et al. 2021: the update that maximises the worst domain's improvement within a ball of
    radius c·|g0| around the mean gradient g0. Solves the dual over the simplex,
        min_w  w^T G b + c |g0| sqrt(w^T G w),  G = the domains' Gram matrix, b = uniform,
    by projected gradient descent (K is small), then d = g0 + c |g0| g_w / |g_w|, scaled by 1/(1+c^2)."""
    g = _check(grads)
    k = g.shape[0]
    gram = g @ g.T
    b = torch.full((k,), 1.0 / k, dtype=g.dtype)
    g0_norm = (b @ gram @ b).clamp_min(0).sqrt()
    radius = c * g0_norm
    w = b.clone()
    step = 1.0 / (gram.diagonal().max() + 1e-12)
    for _ in range(iters):
        quad = (w @ gram @ w).clamp_min(1e-20).sqrt()
        grad = gram @ b + radius * (gram @ w) / quad
        w = _simplex_projection(w - step * grad)
    gw = w @ g
    d = g.mean(0) + radius * gw / (gw.norm() + 1e-12)
    return (d / (1 + c * c)).to(grads[0].dtype)


def combine(mode: str, grads: list[torch.Tensor], *, cagrad_c: float = 0.5,
            generator: torch.Generator | None = None) -> torch.Tensor:
    if mode == "pcgrad":
        return pcgrad(grads, generator)
    if mode == "cagrad":
        return cagrad(grads, cagrad_c)
    raise ValueError(f"unknown gradient surgery {mode!r} (pcgrad, cagrad)")
