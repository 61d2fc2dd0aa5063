"""The ``memlane`` command's own surface: --version, serve --help, and --help without the server extras."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import memlane
from memlane_server.build_info import checkout_commit, recorded_commit
from memlane_server.cli import main
from memlane_server.config import CHOICES, HELP, setting_fields
from memlane_server.observability.logs import configure


def test_version_shows_the_package_version_and_the_checkout_commit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    root = Path(__file__).resolve().parents[3]
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    # The tests run from a checkout (PYTHONPATH or an editable install), so git knows the commit.
    assert capsys.readouterr().out.strip() == f"memlane {memlane.__version__} (commit {head[:12]})"
    assert memlane.__version__ == tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]


def test_a_build_records_its_commit(tmp_path: Path) -> None:
    """The image's build.json wins over git; a missing, broken or foreign file counts as no commit."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "build.json").write_text(json.dumps({"commit": sha}))
    assert recorded_commit(tmp_path / "build.json") == sha
    (tmp_path / "build.json").write_text(json.dumps({"commit": f"{sha}-dirty"}))
    assert recorded_commit(tmp_path / "build.json") == f"{sha}-dirty"
    for text in ("", "{", '{"commit": ""}', '{"commit": "$(rm -rf /)"}', '["a"]'):
        (tmp_path / "build.json").write_text(text)
        assert recorded_commit(tmp_path / "build.json") == ""
    assert recorded_commit(tmp_path / "absent.json") == ""
    # A package directory outside a memlane checkout asks no git, even inside another repository.
    (tmp_path / ".git").mkdir()
    assert checkout_commit(tmp_path / "lib" / "memlane_server") == ""


def test_every_setting_has_a_sentence() -> None:
    names = set(setting_fields())
    assert sorted(names - set(HELP)) == []
    assert sorted(set(HELP) - names) == []
    assert all(text.endswith(".") and len(text) > 20 for text in HELP.values())


def test_serve_help_lists_each_setting_with_its_sentence_and_allowed_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name in setting_fields():
        assert f"--{name.replace('_', '-')}" in out
        assert f"$MEMLANE_{name.upper()}" in out
        assert " ".join(HELP[name].split()[:4]) in out
    for name, allowed in CHOICES.items():
        assert f"--{name.replace('_', '-')} {{{','.join(allowed)}}}" in out
    assert "--auth-required {true,false}" in out


def test_a_value_outside_the_choices_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--log-format", "xml"])
    assert done.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_help_works_without_the_server_extras() -> None:
    # A client-only install: importing any server dependency fails.
    code = (
        "import sys\n"
        "for m in ('redis', 'lancedb', 'prometheus_client', 'onnxruntime', 'pyarrow', 'tqdm', 'yaml'):\n"
        "    sys.modules[m] = None\n"
        "from memlane_server.cli import main\n"
        "main(['--help'])\n"
    )
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "server"), str(root / "client_py")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert out.returncode == 0, out.stderr
    for command in ("serve", "sessions", "trace", "health", "memories"):
        assert command in out.stdout


@pytest.fixture()
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.usefixtures("root_logging")
def test_logs_are_text_on_a_terminal_and_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    configure("INFO", "auto")
    logging.getLogger("memlane.test").info("sidecar ready", extra={"port": 50051})
    line = terminal.getvalue().strip()
    assert "INFO" in line and "memlane.test: sidecar ready" in line and "port=50051" in line
    assert not line.startswith("{")

    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    configure("INFO", "auto")
    logging.getLogger("memlane.test").info("sidecar ready", extra={"port": 50051})
    record = json.loads(piped.getvalue())
    assert record["msg"] == "sidecar ready" and record["port"] == 50051 and record["level"] == "info"


def test_a_misspelt_flag_names_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["serve", "--redis-ulr", "redis://x"])
    assert done.value.code == 2
    assert "--redis-ulr: did you mean --redis-url?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["forget-user", "bob", "--yse"])
    assert "did you mean --yes?" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # control: nothing close, no guess
        main(["serve", "--zzzzqqq"])
    assert "did you mean" not in capsys.readouterr().err
