"""Each setting's help and tier are on its field, and ``memlane serve --help`` lists the operator
settings first and the tuning apart (built by ``config.add_flags``, which the CLI calls)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from memlane_server.config import OPERATOR, TIERS, TUNING, add_flags, setting_fields, settings_by_tier


def test_every_field_carries_its_help_and_its_tier() -> None:
    for name, f in setting_fields().items():
        assert str(f.metadata.get("help", "")).endswith("."), name
        assert f.metadata.get("tier") in TIERS, name


def test_the_operator_settings_are_the_few_an_operator_changes() -> None:
    tiers = settings_by_tier()
    assert 20 <= len(tiers[OPERATOR]) <= 40 < len(tiers[TUNING])
    for name in (
        "listen",
        "admin_listen",
        "redis_url",
        "ltm_uri",
        "archive_uri",
        "worker_processes",
        "session_ttl_seconds",
        "auth_required",
        "log_level",
    ):
        assert name in tiers[OPERATOR]


def test_help_shows_the_operator_settings_first_and_the_tuning_apart() -> None:
    parser = argparse.ArgumentParser(prog="memlane serve")
    add_flags(parser)
    out = parser.format_help()
    operator_at, tuning_at = out.index(f"\n{TIERS[OPERATOR]}:\n"), out.index(f"\n{TIERS[TUNING]}:\n")
    assert operator_at < tuning_at
    for name, tier in ((n, t) for t, names in settings_by_tier().items() for n in names):
        at = out.index(f"  --{name.replace('_', '-')} ")
        assert (operator_at < at < tuning_at) if tier == OPERATOR else (at > tuning_at), name


def test_the_readme_splits_operator_settings_from_tuning_the_same_way() -> None:
    """README.md's settings tables: the operator table names operator settings only, the tuning table
    tuning settings only (a setting named in a row's first cell is that row's)."""
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    operator, tuning = text.split("### Operator settings", 1)[1].split("### Tuning", 1)
    tuning = tuning.split("\n## ", 1)[0]
    tiers = settings_by_tier()
    for table, tier in ((operator, OPERATOR), (tuning, TUNING)):
        named = {
            name
            for line in table.splitlines()
            if line.startswith("| `")
            for name in re.findall(r"`(\w+)`", line.split("|")[1])
            if name in setting_fields()
        }
        assert named, tier
        assert sorted(named - set(tiers[tier])) == [], f"README lists these under {tier}"
