"""Training-time alarms over the metrics the trainer records each step (trainer.py `train_step`).

What it watches, and in which metric:
- reward hacking: the training reward (`reward_<domain>`) rises while an independent held-out
  metric of the same domain falls. Held-out points come from `heldout_<domain>` keys of a step's
  metrics (a periodic eval) or from `observe_eval` (the trainer's eval before and after the run).
- response-length drift: the mean completion length (`completion_len`, tokens) of the latest
  window against the first window, by more than a relative `length_drift`.
- entropy collapse: `entropy`, the policy's mean per-token entropy over the step's completions
  (the trainer computes it from the logits of its loss); metrics without it fall back to
  `distinct_frac` (the share of distinct completions in a group, averaged): identical samples are
  what a collapsed policy produces.
- stagnation: a domain's training reward that has not improved by `stagnation_delta` over the
  last `stagnation_steps` steps (flat, or stuck at the ceiling where GRPO has no signal left).
- no signal: dynamic sampling kept no group (`groups_kept` 0) for a whole window.

An alarm is raised once when its condition starts and re-armed when the condition clears, so a
long run does not repeat the same line every step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from mainspring.train.inspect.findings import Finding, Severity

RUN = "*"  # Finding.domain of an alarm about the run as a whole


@dataclass
class MonitorConfig:
    window: int = 5  # steps averaged on each side of a comparison (rewards are noisy per step)
    length_drift: float = 0.5  # relative change of mean completion length that raises the alarm
    min_length_change: float = 4.0  # tokens: a 2 -> 4 token change is not drift
    entropy_drop: float = 0.5  # the latest window below (1 - this) x the first one
    stagnation_steps: int = 20
    stagnation_delta: float = 0.02
    divergence_delta: float = 0.05  # training reward up and held-out down, each by at least this


@dataclass
class TrainingMonitor:
    config: MonitorConfig = field(default_factory=MonitorConfig)
    history: list[dict[str, Any]] = field(default_factory=list)
    heldout: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    _active: set[tuple[str, str]] = field(default_factory=set)

    def observe(self, step: int, metrics: dict[str, Any]) -> list[Finding]:
        """Record one step's metrics; the alarms that start at this step."""
        self.history.append({"step": step, **metrics})
        for k, v in metrics.items():
            if k.startswith("heldout_") and _number(v):
                self.heldout[k[len("heldout_"):]].append((step, float(v)))
        return self._raise(step, self._conditions())

    def observe_eval(self, step: int, means: dict[str, float]) -> list[Finding]:
        """A held-out evaluation (per-domain mean score) at `step`; divergence alarms it starts."""
        for d, v in means.items():
            if _number(v):
                self.heldout[d].append((step, float(v)))
        return self._raise(step, self._divergence())

    def replay(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rebuild the state from earlier metrics (a resumed run), without raising their alarms again."""
        for m in rows:
            self.observe(int(m.get("step", len(self.history) + 1)), m)

    # -- conditions -------------------------------------------------------------------------------
    def _raise(self, step: int, conditions: list[tuple[tuple[str, str], Finding | None]]) -> list[Finding]:
        out = []
        for key, finding in conditions:
            if finding is None:
                self._active.discard(key)
            elif key not in self._active:
                self._active.add(key)
                out.append(Finding(finding.check, finding.severity, finding.domain, finding.message, finding.item_ids,
                                   {"step": step, **finding.evidence}, finding.fix))
        return out

    def _series(self, key: str) -> list[float]:
        return [float(m[key]) for m in self.history if _number(m.get(key))]

    def _domains(self) -> list[str]:
        return sorted({k[len("reward_"):] for m in self.history for k in m if k.startswith("reward_")})

    def _conditions(self) -> list[tuple[tuple[str, str], Finding | None]]:
        out = [(("monitor.length_drift", RUN), self._length()), (("monitor.entropy_collapse", RUN), self._entropy()),
               (("monitor.no_signal", RUN), self._no_signal())]
        out += [(("monitor.stagnation", d), self._stagnation(d)) for d in self._domains()]
        return out + self._divergence()

    def _length(self) -> Finding | None:
        w, xs = self.config.window, self._series("completion_len")
        if len(xs) < 2 * w:
            return None
        first, last = _mean(xs[:w]), _mean(xs[-w:])
        change = (last - first) / first if first > 0 else float("inf")
        if abs(change) <= self.config.length_drift or abs(last - first) < self.config.min_length_change:
            return None
        way = "grew" if last > first else "shrank"
        return Finding("monitor.length_drift", "warning", RUN,
                       f"mean completion length {way} from {first:.1f} to {last:.1f} tokens ({change:+.0%})",
                       evidence={"first": round(first, 2), "last": round(last, 2), "change": round(change, 4),
                                 "window": w},
                       fix="check rewards for a length bias (a scorer paying longer or shorter answers); "
                           "cap max_tokens or add a length penalty")

    def _entropy(self) -> Finding | None:
        key = "entropy" if self._series("entropy") else "distinct_frac"
        w, xs = self.config.window, self._series(key)
        if len(xs) < 2 * w:
            return None
        first, last = _mean(xs[:w]), _mean(xs[-w:])
        if first <= 0 or last >= (1 - self.config.entropy_drop) * first:
            return None
        return Finding("monitor.entropy_collapse", "warning", RUN,
                       f"{key} fell from {first:.3f} to {last:.3f}: the policy is collapsing onto few outputs",
                       evidence={"metric": key, "first": round(first, 4), "last": round(last, 4), "window": w},
                       fix="lower the learning rate, add a KL term (kl_beta) or raise the temperature")

    def _no_signal(self) -> Finding | None:
        w, kept = self.config.window, self._series("groups_kept")
        if len(kept) < w or any(k > 0 for k in kept[-w:]):
            return None
        return Finding("monitor.no_signal", "warning", RUN,
                       f"no group with reward variance in the last {w} steps: the updates are empty",
                       evidence={"window": w}, fix="inspect the domains' difficulty (mainspring inspect)")

    def _stagnation(self, d: str) -> Finding | None:
        c = self.config
        xs = self._series(f"reward_{d}")[-c.stagnation_steps:]
        if len(xs) < max(c.stagnation_steps, 2 * c.window):
            return None
        first, last = _mean(xs[:c.window]), _mean(xs[-c.window:])
        if last - first >= c.stagnation_delta:
            return None
        at = "at the ceiling" if min(xs) >= 0.98 else "at the floor" if max(xs) <= 0.02 else "flat"
        return Finding("monitor.stagnation", "warning", d,
                       f"training reward of {d} {at} over {len(xs)} steps ({first:.3f} -> {last:.3f})",
                       evidence={"first": round(first, 4), "last": round(last, 4), "steps": len(xs), "state": at},
                       fix="no progress: check the domain's difficulty and verifier, or lower its sampling weight")

    def _divergence(self) -> list[tuple[tuple[str, str], Finding | None]]:
        out: list[tuple[tuple[str, str], Finding | None]] = []
        for d, points in sorted(self.heldout.items()):
            out.append((("monitor.reward_divergence", d), self._diverges(d, points)))
        return out

    def _diverges(self, d: str, points: list[tuple[int, float]]) -> Finding | None:
        if len(points) < 2:
            return None
        (s0, h0), (s1, h1) = points[0], points[-1]
        rows = [(int(m["step"]), float(m[f"reward_{d}"])) for m in self.history if _number(m.get(f"reward_{d}"))]
        w = self.config.window
        # training reward near the first held-out point against near the last one
        early = [r for s, r in rows if s <= max(s0, rows[0][0] + w - 1)][:w] if rows else []
        late = [r for s, r in rows if s <= s1][-w:]
        if not early or not late:
            return None
        dt, dh = _mean(late) - _mean(early), h1 - h0
        delta = self.config.divergence_delta
        if dt < delta or dh > -delta:
            return None
        sev: Severity = "error"
        return Finding("monitor.reward_divergence", sev, d,
                       f"reward hacking alarm: training reward of {d} rose {dt:+.3f} while the held-out score "
                       f"fell {dh:+.3f} (steps {s0} -> {s1})",
                       evidence={"train_delta": round(dt, 4), "heldout_delta": round(dh, 4),
                                 "heldout": [[s, round(v, 4)] for s, v in points[-5:]]},
                       fix="inspect the verifier (mainspring inspect): a reward the policy can earn without "
                           "solving the task; stop or roll back to an earlier checkpoint")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)
