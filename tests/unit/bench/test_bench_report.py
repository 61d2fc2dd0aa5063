"""The bench report judges every target row (latency, rate, memory), writes the verdicts to JSON and
compares a run with an earlier one."""

from __future__ import annotations

import io
import json
from pathlib import Path

from memlane_server.bench.runner import Latency, Report, load


def _report(append_p50: float, rate: float, rss: float) -> Report:
    r = Report(machine="test", started="now")
    echo = Latency("echo", 1.0, 2.0, 10)
    r.latency(Latency("append", append_p50, 3.0, 10), echo, p50_x=1.3, p99_x=2)
    r.rate("echo rate", 1000.0)
    r.rate("append rate", rate, at_least=0.8, of="echo rate")
    r.rate("load", rate, at_least=200)
    r.memory("rss", rss, at_most=200)
    return r


def test_every_target_row_gets_a_verdict_and_json_carries_them(tmp_path: Path) -> None:
    good, bad = _report(1.2, 900.0, 150.0), _report(1.4, 100.0, 250.0)
    assert [r.met for r in good.rows] == [True, None, True, True, True]
    assert [r.met for r in bad.rows] == [False, None, False, False, False]
    out = tmp_path / "run.json"
    out.write_text(bad.to_json())
    raw = json.loads(out.read_text())
    assert raw["targets_met"] == 0 and raw["targets_judged"] == 4
    assert [r["met"] for r in raw["rows"]] == [False, None, False, False, False]


def test_compare_prints_the_ratio_to_an_earlier_run(tmp_path: Path) -> None:
    ref = tmp_path / "ref.json"
    ref.write_text(_report(2.0, 500.0, 300.0).to_json())
    text = io.StringIO()
    _report(1.0, 1000.0, 150.0).print(text, compare=load(str(ref)))
    lines = {line.split(" |")[0].strip("| "): line for line in text.getvalue().splitlines()}
    assert "0.50x echo-relative" in lines["append"]
    assert lines["append rate"].rstrip(" |").endswith("2.00x")
    assert lines["rss"].rstrip(" |").endswith("0.50x")
    assert "4 of 4 targets met" in text.getvalue()
