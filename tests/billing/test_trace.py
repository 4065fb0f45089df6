"""The privacy-safe trace format: reading (with line numbers), appending from threads, segments."""

import json
import threading

import pytest

from mainspring.billing.trace import (Segment, TraceError, TraceRecorder, TraceRequest, read_trace,
                                      segments_from_messages, write_trace)


class WordTokenizer:
    """One token per whitespace-separated word: counts are easy to check by eye."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


def _req(t: float = 0.0, **kw) -> TraceRequest:
    base = dict(t=t, model="m", segments=[Segment(id="s0", kind="system", tokens=10, hash="aa")], output_tokens=3)
    return TraceRequest(**{**base, **kw})


def test_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    reqs = [_req(1.5, key="key_1", project="p", max_output_tokens=16, latency_slo_s=86400), _req(2.0, tier="fast")]
    write_trace(path, reqs)
    assert read_trace(path) == reqs
    assert len(path.read_text().splitlines()) == 2


def test_bad_line_is_named(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps(_req().model_dump(mode="json"))
    path.write_text(f"{good}\n\n{good}\nnot json\n")
    with pytest.raises(TraceError, match=r"t\.jsonl line 4: not JSON"):
        read_trace(path)
    bad = _req().model_dump(mode="json")
    bad["segments"][0]["tokens"] = -1
    path.write_text(f"{good}\n{json.dumps(bad)}\n")
    with pytest.raises(TraceError, match=r"line 2: segments\.0\.tokens"):
        read_trace(path)
    path.write_text(good.replace('"system"', '"banner"') + "\n")
    with pytest.raises(TraceError, match=r"line 1: segments\.0\.kind"):
        read_trace(path)


def test_unknown_fields_missing_file_and_empty_trace(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**_req().model_dump(mode="json"), "prompt": "secret"}) + "\n")
    with pytest.raises(TraceError, match="line 1: prompt"):  # text fields are refused, not carried along
        read_trace(path)
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")
    path.write_text("\n\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(path)


def test_recorder_appends_whole_lines_from_many_threads(tmp_path):
    rec = TraceRecorder(tmp_path / "sub" / "t.jsonl")

    def work(k: int) -> None:
        for i in range(50):
            rec.record_call([Segment(id="s0", kind="user", tokens=i, hash=f"{k}-{i}")], t=float(i), key=f"key_{k}",
                            project="p", model="m", tier="standard", output_tokens=1, max_output_tokens=4)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    reqs = read_trace(rec.path)
    assert len(reqs) == 400
    assert {r.segments[0].hash for r in reqs} == {f"{k}-{i}" for k in range(8) for i in range(50)}


def test_segments_from_messages_kinds_counts_and_hashes():
    tok = WordTokenizer()
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    turn1 = [{"role": "system", "content": "you are a careful agent"},
             {"role": "user", "content": "find the bug please"}]
    turn2 = turn1 + [{"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "search",
                                                                          "arguments": {"q": "bug"}}]},
                     {"role": "tool", "content": "line 3", "tool_call_id": "c1", "name": "search"},
                     {"role": "user", "content": "now fix it"}]
    s1 = segments_from_messages(turn1, tok, tools)
    s2 = segments_from_messages(turn2, tok, tools)
    assert [s.kind for s in s1] == ["tools", "system", "user"]
    assert [s.kind for s in s2] == ["tools", "system", "history", "history", "history", "user"]
    assert [s.tokens for s in s1[1:]] == [5, 4]
    # the same message hashes the same as this turn's question and as next turn's history
    assert [s.hash for s in s1] == [s.hash for s in s2[:3]]
    assert len({s.hash for s in s2}) == len(s2)
    assert s2[3].tokens > 0  # a tool call's arguments are prompt content
    # role is part of the hash: the same words from another role are another segment
    other = segments_from_messages([{"role": "assistant", "content": "find the bug please"},
                                    {"role": "user", "content": "x"}], tok)
    assert other[0].hash != s1[2].hash and other[0].kind == "history"


def test_segments_carry_no_text(tmp_path):
    secret = "the launch code is 0000 and the password is hunter2"
    segs = segments_from_messages([{"role": "system", "content": secret}, {"role": "user", "content": secret}],
                                  WordTokenizer())
    line = json.dumps(_req(segments=segs).model_dump(mode="json"))
    for word in ("launch", "hunter2", "password"):
        assert word not in line


def test_content_parts_and_prefill():
    segs = segments_from_messages([{"role": "user", "content": [{"type": "text", "text": "a b"},
                                                                {"type": "text", "text": "c"}]},
                                   {"role": "assistant", "content": "Sure,"}], WordTokenizer())
    assert [(s.kind, s.tokens) for s in segs] == [("history", 3), ("assistant", 1)]
