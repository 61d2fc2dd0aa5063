"""``memlane eval golden``: a team's own golden set through a real sidecar (real Redis, LanceDB, the ONNX
model), run as the CLI runs it: the documented example passes, a set the memory cannot satisfy fails
with exit status 1 and names its misses, and a malformed file is refused with exit status 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from memlane.v1 import context_pb2 as cpb
from memlane_server.cli import main
from memlane_server.eval.golden import GoldenFileError, context_repeats, load

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "golden" / "cases.yaml"


def _recall(text: str, k: int) -> float:
    m = re.search(rf"recall@{k} (\d\.\d+)", text)
    assert m, text
    return float(m.group(1))


def test_the_example_set_passes_and_a_missing_memory_fails(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", "golden", "--file", str(EXAMPLE), "--redis-url", redis_url]) == 0
    out = capsys.readouterr().out
    assert "3 cases, 4 questions" in out and _recall(out, 5) >= 0.8
    assert "memories injected twice in the questions' contexts: 0" in out

    # The same set plus a question whose expected memory was never said: recall drops under 1.0 and
    # the run fails at threshold 1, naming the miss.
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cases"][0]["questions"].append({"ask": "Which city does the user work in?", "expect": ["Zurich"]})
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(data))
    args = ["eval", "golden", "--file", str(strict), "--threshold", "1", "--redis-url", redis_url]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "'Zurich'" in out and "FAIL" in out and _recall(out, 5) < 1.0


@pytest.mark.parametrize(
    ("doc", "complaint"),
    [
        ({"cases": [{"turns": [{"role": "user", "content": "hi"}]}]}, "at least one question"),
        ({"cases": [{"turns": [{"role": "robot", "content": "hi"}], "questions": []}]}, "role must be"),
        ({"cases": [{"turns": [{"role": "user", "content": "x"}], "questions": [{"ask": "q"}]}]}, "expect"),
        ({"k": 0, "cases": []}, "k must be"),
    ],
)
def test_malformed_files_are_refused(
    tmp_path: Path, doc: dict[str, object], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(GoldenFileError, match=complaint):
        load(path)
    assert main(["eval", "golden", "--file", str(path)]) == 2
    assert complaint in capsys.readouterr().err
    assert load(EXAMPLE).cases  # positive control: the documented example loads


def test_a_memory_injected_twice_is_counted() -> None:
    """The count the golden run prints is 0 above; it would see a repeat by id or by text."""
    line = cpb.ContextMessage(content="Known:\n- Has a cat named Miso.")
    once = cpb.ContextBlock(
        provenance=cpb.PROVENANCE_PROFILE, messages=[line], memories=[cpb.MemoryRef(memory_id="a")]
    )
    again = cpb.ContextBlock(
        provenance=cpb.PROVENANCE_MEMORY,
        messages=[cpb.ContextMessage(content="Recalled:\n- has a cat  named Miso.")],
        memories=[cpb.MemoryRef(memory_id="b")],
    )
    assert context_repeats([cpb.AssembleContextResponse(blocks=[once])]) == 0
    assert context_repeats([cpb.AssembleContextResponse(blocks=[once, again])]) == 1
    same_id = cpb.ContextBlock(provenance=cpb.PROVENANCE_MEMORY, memories=[cpb.MemoryRef(memory_id="a")])
    assert (
        context_repeats(
            [cpb.AssembleContextResponse(blocks=[once]), cpb.AssembleContextResponse(blocks=[same_id])]
        )
        == 1
    )
