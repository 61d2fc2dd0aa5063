"""How a client subcommand tells an error (cli/connection.py): in the command's own words, naming the
flag or argument that sets the request field at fault, on stderr, exit status 1."""

from __future__ import annotations

import pytest

import memlane
from memlane_server.cli.connection import failed, flag_for


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("user_id", "--user"),
        ("memory_ids[1]", "MEMORY_ID"),  # an element of a repeated field: the field's argument
        ("memory.content", "--content"),
        ("no_such_field", ""),
        ("", ""),
    ],
)
def test_a_request_field_maps_to_its_flag(field: str, flag: str) -> None:
    assert flag_for(field) == flag


def test_an_error_names_the_flag_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    exc = memlane.InvalidArgumentError(
        "must not be empty", field_violations=(memlane.FieldViolation("user_id", "must not be empty"),)
    )
    assert failed(exc) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip() == "memlane: --user: must not be empty (InvalidArgumentError)"
