"""The LoCoMo harness end to end on a tiny file in that format, written here (the real file is data
with its own licence and never enters the repo): a real sidecar, replayed sessions, promotion through
the session-end pipeline, SearchMemories, both baselines, the printed table and the JSON report."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import orjson
import pytest
import redis

from memlane_server.eval import run
from memlane_server.eval.evidence import Retrieved, clean_evidence, load, repeats_within
from memlane_server.keyspace import KeySpace


def _turn(dia_id: str, speaker: str, text: str, caption: str = "") -> dict[str, str]:
    turn = {"dia_id": dia_id, "speaker": speaker, "text": text}
    if caption:
        turn["blip_caption"] = caption
    return turn


SAMPLE = {
    "sample_id": "tiny-1",
    "conversation": {
        "speaker_a": "Ada",
        "speaker_b": "Bruno",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            _turn("D1:1", "Ada", "Hi Bruno! I adopted a greyhound called Pixel last weekend."),
            _turn(
                "D1:2", "Bruno", "Congrats! I started pottery classes in Lisbon.", "a clay bowl on a wheel"
            ),
            _turn("D1:3", "Ada", "Lovely. My sister Clara is visiting from Oslo in June."),
        ],
        "session_2_date_time": "10:12 am on 2 June, 2023",
        "session_2": [
            _turn("D2:1", "Bruno", "I finished my first vase and it survived the kiln!"),
            _turn("D2:2", "Ada", "Pixel ran his first race on Saturday and came second."),
            _turn("D2:3", "Bruno", "Amazing, greyhounds are so fast."),
        ],
    },
    "qa": [
        {
            "question": "What is the name of Ada's dog?",
            "answer": "Pixel",
            "evidence": ["D1:1"],
            "category": 4,
        },
        {
            "question": "Where does Bruno take pottery classes?",
            "answer": "Lisbon",
            "evidence": ["D1:02"],
            "category": 4,
        },
        {
            "question": "When did Pixel run his first race?",
            "answer": "June 2023",
            "evidence": ["D:2:2"],
            "category": 2,
        },
        {
            "question": "Who is visiting Ada and from where?",
            "answer": "Clara, Oslo",
            "evidence": ["D1:3; D"],
            "category": 1,
        },
        {
            "question": "What did Bruno make in the kiln?",
            "answer": "a vase",
            "evidence": ["D2:1"],
            "category": 3,
        },
        {
            "question": "What did Ada bake?",
            "adversarial_answer": "bread",
            "evidence": ["D2:2"],
            "category": 5,
        },
        {"question": "A question left without evidence", "answer": "-", "evidence": ["D9:9"], "category": 4},
    ],
}


def test_evidence_ids_are_cleaned() -> None:
    known = {"D1:1", "D11:26", "D30:5"}
    assert clean_evidence(["D:11:26", "D30:05; D1:1", "D", "D4:4", "D1:1 D30:5"], known) == known


def test_harness_end_to_end(tmp_path: Path, redis_url: str) -> None:
    data = tmp_path / "tiny.json"
    data.write_bytes(orjson.dumps([SAMPLE]))
    conv = load(data)[0]
    assert len(conv.questions) == 6  # the one whose evidence names no turn is skipped
    assert conv.sessions[0].turns[1].baseline_text() == (
        "(1:56 pm on 8 May, 2023) Bruno: Congrats! I started pottery classes in Lisbon."
        " [shares a clay bowl on a wheel]"
    )

    out = io.StringIO()
    prefix = f"evaltest{uuid.uuid4().hex[:8]}"
    report = run(data, json_out=tmp_path / "report.json", redis_url=redis_url, out=out, key_prefix=prefix)
    # The run used this Redis (sessions were replayed and promoted) and left none of its keys behind.
    assert report.turns == 6
    assert list(redis.Redis.from_url(redis_url).scan_iter(match=KeySpace(prefix).pattern())) == []

    assert [s.name for s in report.systems] == ["memlane", "bm25", "vector"]
    memlane = report.systems[0]
    assert set(memlane.by_category) == {1, 2, 3, 4, 5}
    assert memlane.scored().n == 5  # categories 1-4 scored together; 5 apart
    # Six turns fit easily in 1024 tokens: every evidence turn must come back, and provenance must
    # name the replayed dia_ids.
    assert memlane.scored().summary()["recall@1024tok"] == 1.0
    assert memlane.by_category[4].summary()["R@5"] == 1.0
    assert len(memlane.latencies_ms) == 6 and report.turns == 6 and report.ingest_s > 0
    text = out.getvalue()
    assert "overall 1-4" in text and "(5 adversarial)" in text and "bm25" in text and "vector" in text
    saved = orjson.loads((tmp_path / "report.json").read_bytes())
    assert set(saved["systems"]) == {"memlane", "bm25", "vector"}
    assert saved["systems"]["bm25"]["overall_1_4"]["n"] == 5


def test_compare_memory_off(tmp_path: Path, redis_url: str) -> None:
    """The context A/B: asked as the next turn of the last session, only memory brings session 1 back."""
    data = tmp_path / "tiny.json"
    data.write_bytes(orjson.dumps([SAMPLE]))
    out = io.StringIO()
    report = run(data, redis_url=redis_url, out=out, compare="memory-off")
    ab = report.memory_off
    assert ab is not None
    # Ada's dog (D1:1) and the pottery city (D1:2) were said in session 1: memory recalls them.
    assert ab.memory_on.by_category[4] == [1.0, 1.0]
    assert ab.memory_off.by_category[4] == [0.0, 0.0]
    # Positive control for the off side: session 2's evidence (the kiln, the race) is in its history.
    assert ab.memory_off.by_category[3] == [1.0] and ab.memory_off.by_category[2] == [1.0]
    assert "context A/B" in out.getvalue() and "overall 1-4" in out.getvalue()


def test_leave_one_conversation_out(tmp_path: Path, redis_url: str) -> None:
    """Two conversations: each fold chooses its knobs on the other one and is scored on its own."""
    data = tmp_path / "two.json"
    data.write_bytes(orjson.dumps([SAMPLE, {**SAMPLE, "sample_id": "tiny-2"}]))
    out = io.StringIO()
    report = run(data, json_out=tmp_path / "report.json", redis_url=redis_url, out=out, leave_one_out=True)
    loo = report.leave_one_out
    assert loo is not None
    assert [f.held_out for f in loo.folds] == [0, 1]
    assert all(f.chosen in loo.configs for f in loo.folds)
    assert loo.configs[0] == {"keyword_weight": 1.5, "rrf_k": 4.0, "expansion_weight": 1.0}  # shipped first
    # The two conversations are the same, so the held-out figure equals the tuned one in each fold.
    assert all(f.held_out_score == f.tuned_on_rest for f in loo.folds)
    assert loo.held_out().n == 10 and loo.shipped().n == 10
    assert "leave-one-conversation-out" in out.getvalue()
    saved = orjson.loads((tmp_path / "report.json").read_bytes())
    assert len(saved["leave_one_out"]["folds"]) == 2
    # Every stored item is counted (each is one embedded text): the six turns are no filler.
    assert [c["episodic"] for c in saved["stored_per_conversation"]] == [6, 6]
    assert saved["stored_per_100_turns"] == pytest.approx(100.0 * 12 / saved["turns"])
    # No result a reader gets within 512 tokens repeats another's text (and the count would see one).
    assert saved["systems"]["memlane"]["repeats_within_512tok"] == {"results": 0, "tokens": 0}
    assert "memories stored per 100 turns" in out.getvalue()
    doubled = [Retrieved("Ada: hi", ("D1:1",), 3), Retrieved("ada:  HI", ("D2:1",), 3)]
    assert repeats_within(doubled, 512) == (1, 3) and repeats_within(doubled, 4) == (0, 0)
