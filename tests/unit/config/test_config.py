"""Settings: one name everywhere, layered defaults < file < environment < flags, bad values refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memlane_server.config import CHOICES, ConfigError, Settings, build_settings, setting_fields


def test_layers_override_in_order(tmp_path: Path) -> None:
    cfg = tmp_path / "memlane.yaml"
    cfg.write_text("redis_url: redis://file:6379/0\nsession_ttl_seconds: 60\nkey_prefix: fromfile\n")
    env = {"MEMLANE_CONFIG": str(cfg), "MEMLANE_SESSION_TTL_SECONDS": "120", "MEMLANE_KEY_PREFIX": "fromenv"}
    s = build_settings(flags={"key_prefix": "fromflag"}, env=env)
    assert s.redis.redis_url == "redis://file:6379/0"  # file
    assert s.sessions.session_ttl_seconds == 120  # env over file
    assert s.redis.key_prefix == "fromflag"  # flag over env
    assert s.server.listen == Settings().server.listen  # default


def test_toml_and_booleans(tmp_path: Path) -> None:
    cfg = tmp_path / "memlane.toml"
    cfg.write_text('auth_required = true\nlisten = "unix:/tmp/m.sock"\n')
    s = build_settings(config_file=str(cfg), env={"MEMLANE_LTM_ENABLED": "off"})
    assert s.access.auth_required is True and s.server.listen == "unix:/tmp/m.sock"
    assert s.ltm.ltm_enabled is False


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"MEMLANE_SESSION_TTL_SECONDS": "soon"}, r"session_ttl_seconds: cannot use 'soon' from \$MEMLANE"),
        ({"MEMLANE_AUTH_REQUIRED": "maybe"}, "auth_required"),
        ({"MEMLANE_DEFAULT_TOPOLOGY": "mesh"}, "default_topology: 'mesh' is not one of shared"),
        ({"MEMLANE_SUMMARIZER": "gpt"}, "summarizer"),
    ],
)
def test_bad_values_name_the_setting(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_settings(env=env)


def test_unknown_keys_in_a_file_are_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "memlane.yaml"
    cfg.write_text("redis_ur1: redis://typo\n")
    with pytest.raises(ConfigError, match="unknown setting 'redis_ur1'"):
        build_settings(config_file=str(cfg), env={})


def test_every_choice_setting_exists_and_defaults_to_a_choice() -> None:
    for name, allowed in CHOICES.items():
        assert Settings().value(name) in allowed


def test_each_setting_sits_in_one_section_under_its_own_name() -> None:
    sections = [getattr(Settings(), f.name) for f in dataclasses.fields(Settings)]
    per_section = [f.name for section in sections for f in dataclasses.fields(section)]
    assert sorted(per_section) == sorted(setting_fields())  # no name in two sections, none elsewhere
    s = Settings.of(redis_url="redis://x:6379/0", ltm_cache_mb=7)
    assert s.redis.redis_url == "redis://x:6379/0" and s.ltm.ltm_cache_mb == 7
    assert s.value("ltm_cache_mb") == 7 and s.sessions == Settings().sessions
    with pytest.raises(TypeError, match="redis_ur1"):
        Settings.of(redis_ur1="redis://typo")


def test_the_file_stays_flat(tmp_path: Path) -> None:
    """One name per setting: a section is how the code reads settings, not a second spelling in files."""
    cfg = tmp_path / "memlane.yaml"
    cfg.write_text("redis:\n  redis_url: redis://nested\n")
    with pytest.raises(ConfigError, match="unknown setting 'redis'"):
        build_settings(config_file=str(cfg), env={})
