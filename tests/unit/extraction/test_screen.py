"""The screen every extractor's output passes (extraction/extractor.py): small talk, PII and repeats
are dropped and counted."""

from __future__ import annotations

from memlane_server.extraction.extractor import ExtractedMemory, ExtractionResult, screen
from memlane_server.memory_kinds import MemoryKind


def test_small_talk_pii_and_repeats_are_dropped_and_counted() -> None:
    result = screen(
        ExtractionResult(
            memories=[
                ExtractedMemory(MemoryKind.FACT, "User lives in Pune."),
                ExtractedMemory(MemoryKind.FACT, "Thanks!"),
                ExtractedMemory(MemoryKind.FACT, "User's email is jo@example.com."),
                ExtractedMemory(MemoryKind.FACT, "user lives in pune"),
                ExtractedMemory(
                    MemoryKind.PREFERENCE, "User prefers metric units.", keywords=["4111 1111 1111 1111"]
                ),
            ]
        )
    )
    assert [m.content for m in result.memories] == ["User lives in Pune."]
    assert (result.rejected_picky, result.rejected_pii) == (2, 2)
