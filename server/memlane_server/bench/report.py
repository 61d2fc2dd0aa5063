"""The bench report: one row per figure, each with its target and whether this run met it.

Latency rows carry p50/p99 and the echo round trip measured just before them (the machine is noisy:
ratios drift far less than absolute times); rate and memory rows carry one value. ``--json`` writes
the rows with their verdicts; ``--compare REF.json`` prints each figure's ratio to an earlier run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from .runner import Latency


@dataclass
class Row:
    name: str
    unit: str  # "ms" (value is the p50), "/s" or "MB"
    value: float
    p99_ms: float = 0.0
    echo_p50_ms: float = 0.0
    target: str = ""
    met: bool | None = None  # None: a figure without a target
    ratio: float = 0.0  # a rate's fraction of the reference rate it is judged against
    note: str = ""


@dataclass
class Report:
    machine: str
    started: str
    rows: list[Row] = field(default_factory=list)

    def latency(
        self,
        lat: Latency,
        echo: Latency | None = None,
        *,
        p50_x: float = 0.0,
        p99_x: float = 0.0,
        p50_ms: float = 0.0,
        p99_ms: float = 0.0,
        like: str = "",
        note: str = "",
    ) -> Row:
        """A latency row; targets as multiples of the echo (``*_x``) or absolute (``*_ms``)."""
        base = echo.p50_ms if echo else 0.0
        goals: list[tuple[str, bool]] = []
        if p50_x:
            goals.append((f"p50 <= {p50_x:g}x echo", lat.p50_ms <= p50_x * base))
        if p99_x and echo is not None:
            goals.append((f"p99 <= {p99_x:g}x echo p99", lat.p99_ms <= p99_x * echo.p99_ms))
        if p50_ms:
            goals.append((f"p50 <= {p50_ms:g} ms", lat.p50_ms <= p50_ms))
        if p99_ms:
            goals.append((f"p99 <= {p99_ms:g} ms", lat.p99_ms <= p99_ms))
        ref = self.get(like) if like else None
        if ref is not None and ref.echo_p50_ms and base:
            # "No slower than" another row measured in another process: compared as ratios to each
            # one's echo, with 10% for the noise between two series.
            ok = lat.p50_ms / base <= 1.1 * ref.value / ref.echo_p50_ms
            goals.append((f"p50 / echo <= 1.1x that of {like!r}", ok))
        row = Row(lat.name, "ms", lat.p50_ms, lat.p99_ms, base, note=note)
        self._judge(row, goals)
        print(f"  {lat.name}: p50 {lat.p50_ms:.3f} ms, p99 {lat.p99_ms:.3f} ms", file=sys.stderr, flush=True)
        return row

    def rate(self, name: str, per_s: float, *, at_least: float = 0.0, of: str = "", note: str = "") -> Row:
        """A rate; ``at_least`` is absolute, or a fraction of the row named ``of`` (the echo's rate)."""
        row = Row(name, "/s", per_s, note=note)
        if at_least and of:
            ref = self.get(of)
            row.ratio = per_s / ref.value if ref and ref.value else 0.0
            self._judge(row, [(f">= {at_least:g}x {of}", row.ratio >= at_least)])
        elif at_least:
            self._judge(row, [(f">= {at_least:g}/s", per_s >= at_least)])
        else:
            self.rows.append(row)
        print(f"  {name}: {per_s:.1f}/s", file=sys.stderr, flush=True)
        return row

    def memory(self, name: str, mb: float, *, at_most: float, note: str = "") -> Row:
        row = Row(name, "MB", mb, note=note)
        self._judge(row, [(f"<= {at_most:g} MB", mb <= at_most)])
        print(f"  {name}: {mb:.0f} MB", file=sys.stderr, flush=True)
        return row

    def _judge(self, row: Row, goals: list[tuple[str, bool]]) -> None:
        if goals:
            row.target = ", ".join(text for text, _ in goals)
            row.met = all(ok for _, ok in goals)
        self.rows.append(row)

    def get(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def targets(self) -> tuple[int, int]:
        """(met, judged)."""
        judged = [r for r in self.rows if r.met is not None]
        return sum(1 for r in judged if r.met), len(judged)

    def print(self, out: TextIO = sys.stdout, compare: Report | None = None) -> None:
        w = out.write
        w(f"memlane bench, {self.started}, {self.machine}\n\n")
        extra = " vs ref |" if compare else ""
        w(f"| measure | p50 ms / value | p99 ms | p50 / echo | target |{extra}\n")
        w("|---|---:|---:|---:|---|" + ("---:|" if compare else "") + "\n")
        for r in self.rows:
            verdict = "" if r.met is None else (" (met)" if r.met else " (MISSED)")
            value = f"{r.value:.3f}" if r.unit == "ms" else f"{r.value:.1f}{r.unit}"
            p99 = f"{r.p99_ms:.3f}" if r.p99_ms else ""
            x = f"{r.value / r.echo_p50_ms:.2f}x" if r.unit == "ms" and r.echo_p50_ms else ""
            x = f"{r.ratio:.2f}x" if r.ratio else x
            note = f" {r.note}" if r.note else ""
            line = f"| {r.name}{note} | {value} | {p99} | {x} | {r.target}{verdict} |"
            if compare is not None:
                line += f" {_versus(r, compare.get(r.name))} |"
            w(line + "\n")
        met, judged = self.targets
        w(f"\n{met} of {judged} targets met\n")

    def to_json(self) -> str:
        met, judged = self.targets
        return json.dumps({**asdict(self), "targets_met": met, "targets_judged": judged}, indent=2)


def _versus(row: Row, ref: Row | None) -> str:
    """This figure over the reference's (for ms rows, the ratios to each run's own echo, when both
    have one: that cancels most of the machine's drift between the runs)."""
    if ref is None or not ref.value:
        return ""
    raw = f"{row.value / ref.value:.2f}x"
    if row.unit == "ms" and row.echo_p50_ms and ref.echo_p50_ms:
        return (
            f"{(row.value / row.echo_p50_ms) / (ref.value / ref.echo_p50_ms):.2f}x echo-relative ({raw} raw)"
        )
    return raw


def load(path: str) -> Report:
    """A report written by ``--json`` (this version's format)."""
    raw = json.loads(Path(path).read_text())
    rows = [Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in raw.get("rows", [])]
    return Report(machine=str(raw.get("machine", "")), started=str(raw.get("started", "")), rows=rows)
