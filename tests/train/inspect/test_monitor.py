"""Training-time alarms: each on clean and planted metric streams, and the trainer's hook (tiny model)."""

from __future__ import annotations

import json

import pytest

from mainspring.train.domains.base import Domain, DomainSettings, Sample, Score
from mainspring.train.inspect.findings import Finding
from mainspring.train.inspect.monitor import MonitorConfig, TrainingMonitor

CFG = MonitorConfig(window=3, stagnation_steps=8)


def healthy(step: int) -> dict:
    """Reward climbing, length and diversity steady, groups kept."""
    return {"reward": 0.2 + 0.03 * step, "reward_math": 0.2 + 0.03 * step, "completion_len": 20 + step % 2,
            "distinct_frac": 0.9, "groups": 4, "groups_kept": 3}


def run(stream, monitor: TrainingMonitor | None = None) -> list[Finding]:
    monitor = monitor or TrainingMonitor(CFG)
    out: list[Finding] = []
    for step, m in enumerate(stream, start=1):
        out += monitor.observe(step, m)
    return out


def test_a_healthy_run_raises_nothing():
    mon = TrainingMonitor(CFG)
    assert run([healthy(s) for s in range(1, 21)], mon) == []
    assert mon.observe_eval(0, {"math": 0.3}) == [] and mon.observe_eval(20, {"math": 0.5}) == []


def test_length_drift_is_raised_once():
    stream = [dict(healthy(s), completion_len=20 + 6 * s) for s in range(1, 13)]
    found = [f for f in run(stream) if f.check == "monitor.length_drift"]
    assert len(found) == 1 and found[0].severity == "warning" and "grew" in found[0].message
    assert found[0].evidence["step"] >= 6
    shrink = [dict(healthy(s), completion_len=max(1, 60 - 8 * s)) for s in range(1, 9)]
    assert any(f.check == "monitor.length_drift" and "shrank" in f.message for f in run(shrink))


def test_small_length_changes_are_not_drift():
    stream = [dict(healthy(s), completion_len=2 + (s > 5) * 2) for s in range(1, 12)]  # 2 -> 4 tokens: +100%, tiny
    assert not any(f.check == "monitor.length_drift" for f in run(stream))


def test_entropy_collapse_from_distinct_share_and_from_entropy():
    stream = [dict(healthy(s), distinct_frac=1.0 if s <= 4 else 0.25) for s in range(1, 10)]
    found = [f for f in run(stream) if f.check == "monitor.entropy_collapse"]
    assert len(found) == 1 and found[0].evidence["metric"] == "distinct_frac"
    stream = [dict(healthy(s), entropy=2.0 / s) for s in range(1, 10)]
    found = [f for f in run(stream) if f.check == "monitor.entropy_collapse"]
    assert len(found) == 1 and found[0].evidence["metric"] == "entropy"


def test_stagnation_per_domain():
    stream = [dict(healthy(s), reward_json=0.41 + 0.01 * (s % 2)) for s in range(1, 13)]
    found = [f for f in run(stream) if f.check == "monitor.stagnation"]
    assert [f.domain for f in found] == ["json"] and found[0].evidence["state"] == "flat"
    ceiling = [dict(healthy(s), reward_json=1.0) for s in range(1, 10)]
    assert [f.evidence["state"] for f in run(ceiling) if f.check == "monitor.stagnation"] == ["at the ceiling"]


def test_an_alarm_rearms_after_its_condition_clears():
    flat = [dict(healthy(s), reward_math=0.5) for s in range(1, 9)]
    climb = [dict(healthy(s), reward_math=0.5 + 0.1 * i) for i, s in enumerate(range(9, 17), start=1)]
    flat2 = [dict(healthy(s), reward_math=1.3) for s in range(17, 30)]
    found = [f for f in run(flat + climb + flat2) if f.check == "monitor.stagnation"]
    assert len(found) == 2


def test_no_signal_when_no_group_is_kept():
    stream = [dict(healthy(s), groups_kept=0 if s > 2 else 2) for s in range(1, 7)]
    found = [f for f in run(stream) if f.check == "monitor.no_signal"]
    assert len(found) == 1


def test_reward_up_while_heldout_down_is_the_hacking_alarm():
    mon = TrainingMonitor(CFG)
    assert mon.observe_eval(0, {"math": 0.6}) == []
    run([healthy(s) for s in range(1, 11)], mon)  # training reward of math climbs 0.23 -> 0.5
    found = mon.observe_eval(10, {"math": 0.4})
    assert len(found) == 1 and found[0].check == "monitor.reward_divergence"
    assert found[0].severity == "error" and found[0].domain == "math" and found[0].evidence["heldout_delta"] < 0


def test_heldout_points_in_step_metrics_are_read():
    stream = [dict(healthy(s), **({"heldout_math": 0.7 - 0.05 * s} if s % 3 == 0 else {})) for s in range(1, 13)]
    found = [f for f in run(stream) if f.check == "monitor.reward_divergence"]
    assert len(found) == 1 and found[0].domain == "math"


def test_heldout_falling_with_training_reward_is_no_divergence():
    mon = TrainingMonitor(CFG)
    mon.observe_eval(0, {"math": 0.6})
    run([dict(healthy(s), reward_math=0.5 - 0.02 * s) for s in range(1, 11)], mon)
    assert mon.observe_eval(10, {"math": 0.4}) == []


def test_replay_does_not_raise_again_but_keeps_the_windows():
    stream = [dict(healthy(s), completion_len=20 + 6 * s) for s in range(1, 13)]
    mon = TrainingMonitor(CFG)
    mon.replay({"step": s, **m} for s, m in enumerate(stream, start=1))
    assert mon.observe(13, dict(healthy(13), completion_len=100)) == []  # already raised before the resume


def test_bad_values_are_ignored():
    stream = [dict(healthy(s), completion_len=float("nan"), distinct_frac=None, reward_math="x") for s in range(1, 12)]
    assert run(stream) == []


# -- the trainer's hook -----------------------------------------------------------------------------
class Zero:
    def score(self, sample, completion):
        return Score(0.0)


def zero_domain() -> Domain:
    def s(i, split):
        return Sample(f"{split}{i}", "flat", ({"role": "user", "content": f"Say {i}."},))
    return Domain("flat", [s(i, "t") for i in range(6)], [s(i, "e") for i in range(2)], Zero(),
                  DomainSettings(max_tokens=4, temperature=1.0))


@pytest.fixture(scope="module")
def tiny(embedded):
    from mainspring.engine.loader import LoadedModel
    from tests.train.tiny import tiny_config, tiny_state

    cfg = tiny_config(vocab=embedded.config.vocab_size, hidden=32, context=256)
    return LoadedModel("tiny", embedded.path, cfg, tiny_state(cfg), embedded.tokenizer)


def tiny_config_(**kw):
    from mainspring.train.config import TrainConfig

    base = {"domains": [{"name": "flat"}], "steps": 3, "prompts_per_step": 2, "group_size": 2, "threads": 1,
            "eval_before": False, "eval_after": False, "export": False, "checkpoint_every": 10, "micro_batch": 4,
            "max_refill_rounds": 0}
    return TrainConfig.parse({**base, **kw})


def test_the_trainer_emits_alarms_as_events_and_writes_them(tiny, tmp_path, monkeypatch):
    import mainspring.train.trainer as trainer

    monkeypatch.setattr(trainer, "TrainingMonitor", lambda: TrainingMonitor(MonitorConfig(window=2)))
    events = []
    trainer.run_training(tiny_config_(), tmp_path, domains={"flat": zero_domain()}, loaded=tiny, on_event=events.append)
    alarms = [e for e in events if e.kind == "alarm"]
    assert [e.data["check"] for e in alarms] == ["monitor.no_signal"] and alarms[0].step == 2
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["alarms"] for m in lines] == [[], ["monitor.no_signal"], []]
    assert all(0 < m["distinct_frac"] <= 1 for m in lines)
    written = [json.loads(ln) for ln in (tmp_path / "alarms.jsonl").read_text().splitlines()]
    assert [(a["step"], a["check"], a["severity"]) for a in written] == [(2, "monitor.no_signal", "warning")]


def test_the_trainer_reports_divergence_after_its_eval(tiny, tmp_path, monkeypatch):
    import mainspring.train.trainer as trainer

    class Planted(TrainingMonitor):
        def observe_eval(self, step, means):
            super().observe_eval(step, means)
            return ([Finding("monitor.reward_divergence", "error", "flat", "planted", evidence={"step": step})]
                    if step else [])

    monkeypatch.setattr(trainer, "TrainingMonitor", Planted)
    events = []
    trainer.run_training(tiny_config_(steps=1, eval_before=True, eval_after=True, eval_size=2), tmp_path,
                         domains={"flat": zero_domain()}, loaded=tiny, on_event=events.append)
    assert [(e.step, e.data["check"]) for e in events if e.kind == "alarm"] == [(1, "monitor.reward_divergence")]
    assert "monitor.reward_divergence" in (tmp_path / "alarms.jsonl").read_text()


def test_a_resumed_run_does_not_raise_its_alarms_again(tiny, tmp_path, monkeypatch):
    import mainspring.train.trainer as trainer

    monkeypatch.setattr(trainer, "TrainingMonitor", lambda: TrainingMonitor(MonitorConfig(window=2)))
    cfg = tiny_config_(checkpoint_every=1)
    metrics = tmp_path / "metrics.jsonl"

    def after_two() -> bool:
        return metrics.exists() and len(metrics.read_text().splitlines()) >= 2

    first = trainer.run_training(cfg, tmp_path, domains={"flat": zero_domain()}, loaded=tiny, should_stop=after_two)
    assert first.stopped and first.steps_done == 2
    events = []
    trainer.run_training(cfg, tmp_path, resume=True, domains={"flat": zero_domain()}, loaded=tiny,
                         on_event=events.append)
    assert [e for e in events if e.kind == "alarm"] == []
    written = [json.loads(ln)["check"] for ln in (tmp_path / "alarms.jsonl").read_text().splitlines()]
    assert written == ["monitor.no_signal"]
