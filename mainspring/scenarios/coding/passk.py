"""The unbiased pass@k estimator of Chen et al. 2021 (Codex, HumanEval): with n samples of which c are correct,
pass@k = 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement hold a correct one. It is
computed as a running product (1 - k/i for i in n-c+1..n), as the paper's code does, so large n never builds
huge binomials."""

from __future__ import annotations

from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k for one problem; ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n and n >= 1, not n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be 1..n ({n}), not {k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """The mean of pass@k over problems given as (n, c); problems with fewer than k samples are an error."""
    if not counts:
        return 0.0
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
