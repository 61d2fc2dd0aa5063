"""Each default is written once, in ``config.py``: the component configs that carry a setting's value
(``WorkerConfig``, ``LearnConfig``, ``PipelineConfig``, ``MemoryTuning``, ``BudgetPolicy``, the providers'
endpoints, the input ``Limits``) have no default of their own for it, and ``wiring/`` builds them from a
``Settings``.

The check: every component config is built through wiring twice, from the default settings and from
settings where every setting has another value. A field that follows the settings must have no default
(else two places would say what it is), and every field without a default must follow them (else wiring
filled it with a literal). A field that keeps a default is a constant, not a setting, and its default must
not repeat a setting of its name."""

from __future__ import annotations

import ast
import dataclasses
import operator
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memlane_server.config import CHOICES, Settings, setting_fields
from memlane_server.context.model import Fallback, Strategy
from memlane_server.wiring.lifecycle import (
    budget_policy,
    extractor_endpoint,
    learn_config,
    pipeline_config,
    summarizer_endpoint,
    worker_config,
)
from memlane_server.wiring.stores import memory_tuning, session_limits


def _other(name: str, default: Any) -> Any:
    """A valid value of the setting that differs from its default."""
    if name in CHOICES:
        return next(c for c in CHOICES[name] if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 3
    if isinstance(default, float):
        return default / 2 if default else 0.5  # ratios and similarities stay in range
    return f"{default}-other"


CHANGED = Settings.of(**{name: _other(name, f.default) for name, f in setting_fields().items()})

# Each component config's builder, as wiring calls it.
BUILDERS: dict[str, Callable[[Settings], Any]] = {
    "WorkerConfig": worker_config,
    "LearnConfig": learn_config,
    "PipelineConfig": lambda s: pipeline_config(s.pipeline),
    "MemoryTuning": lambda s: memory_tuning(s.ltm),
    "BudgetPolicy": lambda s: budget_policy(s.context),
    "OpenAIExtractorSettings": lambda s: extractor_endpoint(s.extraction),
    "OpenAISettings": lambda s: summarizer_endpoint(s.summarization),
    "Limits": lambda s: session_limits(s.sessions),
}


def _followed(default: Any, changed: Any) -> set[str]:
    """The fields whose value moved with the settings."""
    return {
        f.name for f in dataclasses.fields(default) if getattr(default, f.name) != getattr(changed, f.name)
    }


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_a_field_that_follows_the_settings_has_no_default_of_its_own(kind: str) -> None:
    default, changed = BUILDERS[kind](Settings()), BUILDERS[kind](CHANGED)
    assert type(default).__name__ == kind
    followed = _followed(default, changed)
    assert followed, f"{kind} reads no setting"
    required = {f.name for f in dataclasses.fields(default) if _has_no_default(f)}
    assert sorted(followed - required) == [], f"{kind}: defaults that repeat a setting's"
    assert sorted(required - followed) == [], f"{kind}: fields wiring fills without the settings"


def _has_no_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_no_default_left_repeats_a_setting_of_its_name(kind: str) -> None:
    """``max_failures`` beside ``pipeline_max_failures``, ``duplicate_similarity`` beside
    ``ltm_duplicate_similarity``: a constant may stay, but not as a second copy of a setting's default."""
    config = BUILDERS[kind](Settings())
    settings = setting_fields()
    for f in dataclasses.fields(config):
        if _has_no_default(f):
            continue
        stem = f.name.removesuffix("_s") + "_seconds" if f.name.endswith("_s") else f.name
        for name, s in settings.items():
            if name == stem or name.endswith(f"_{stem}"):
                assert f.default != s.default, f"{kind}.{f.name} repeats the default of {name}"


def test_each_component_sees_its_settings() -> None:
    """The settings issue 34 found repeated, and the rest of each config's: set to other values, the
    components see those values."""
    s = CHANGED
    p, lc, c, ltm = s.pipeline, s.lifecycle, s.context, s.ltm
    claim_ms = int(p.pipeline_claim_timeout_seconds * 1000)
    worker = worker_config(s)
    assert (worker.max_failures, worker.concurrency) == (p.pipeline_max_failures, p.pipeline_concurrency)
    assert (worker.claim_timeout_ms, worker.retire_interval_s) == (
        claim_ms,
        lc.lifecycle_sweep_interval_seconds,
    )
    assert worker.retention_interval_s == p.archive_retention_interval_seconds
    learn = learn_config(s)
    assert (learn.every_turns, learn.idle_s) == (p.learn_every_turns, p.learn_idle_seconds)
    assert learn.tick_s == lc.lifecycle_sweep_interval_seconds
    pipeline = pipeline_config(p)
    assert (pipeline.chunk_messages, pipeline.summary_tokens) == (
        p.pipeline_chunk_messages,
        p.pipeline_summary_tokens,
    )
    assert pipeline.lease_ms == claim_ms
    tuning = memory_tuning(ltm)
    assert tuning.duplicate_similarity == ltm.ltm_duplicate_similarity
    assert (tuning.max_items_per_agent, tuning.max_episodes_per_agent) == (
        ltm.ltm_max_items_per_agent,
        ltm.ltm_max_episodes_per_agent,
    )
    assert tuning.profile_max_items == ltm.ltm_profile_max_items
    assert tuning.expansion_weight == 0.0  # ltm_recall_expansion turned off
    policy = budget_policy(c)
    assert (policy.window_turns, policy.trigger_ratio) == (
        c.context_window_turns,
        c.context_summary_trigger_ratio,
    )
    assert policy.default_reserved_output == c.context_reserved_output_tokens
    assert policy.memory_min_similarity == c.context_memory_min_similarity
    assert policy.default_strategy is Strategy.FULL_BUFFER  # context_strategy: full_buffer
    assert policy.fallback is Fallback.DROPPED_OLDEST  # context_fallback: drop_oldest
    extractor = extractor_endpoint(s.extraction)
    assert (extractor.api_key, extractor.timeout_s) == (
        s.extraction.extractor_api_key,
        s.extraction.extractor_timeout_seconds,
    )
    summarizer = summarizer_endpoint(s.summarization)
    assert summarizer.timeout_s == s.summarization.summarizer_timeout_seconds


PACKAGE = Path(__file__).resolve().parents[3] / "server" / "memlane_server"
# Defaults that mean "none" or "off" say nothing a setting would have to hold.
_NEUTRAL = ("", 0, 0.0, False, None)
# Defaults left repeating a setting's, each with why: none. (``Limits``' batch bounds were the last:
# they are required now, built in wiring/stores.py for AppendMessages, ExtractMemories and user import.)
_KNOWN: frozenset[str] = frozenset()


def _defaults(tree: ast.Module) -> Iterator[tuple[str, str, ast.expr]]:
    """(owner, name, default) of every dataclass-style field and every parameter with a default."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and st.value is not None and isinstance(st.target, ast.Name):
                    yield node.name, st.target.id, st.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            named = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
            named += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
            for arg, default in named:
                yield node.name, arg.arg, default


_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.LShift: operator.lshift,
}


def _literal(node: ast.expr) -> Any:
    """A literal, or arithmetic over literals (``256 * 1024``); ``ValueError`` for anything else."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_literal(node.left), _literal(node.right))
    return ast.literal_eval(node)


def test_no_default_in_the_package_repeats_a_setting_of_its_name() -> None:
    """Every field and parameter of the server package: a default (not none/off) must not be a second copy
    of the default of a setting of the same name (``timeout_ms`` ~ ``redis_wait_timeout_ms``)."""
    settings = {name: f.default for name, f in setting_fields().items()}
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "config.py":
            continue
        for owner, name, node in _defaults(ast.parse(path.read_text())):
            try:
                value = _literal(node)
            except ValueError:
                continue  # a name, a call, a factory: not a literal copy
            if value in _NEUTRAL or isinstance(value, bool):
                continue
            stem = name.removesuffix("_s") + "_seconds" if name.endswith("_s") else name
            for setting, default in settings.items():
                if (setting == stem or setting.endswith(f"_{stem}")) and default == value:
                    found.add(f"{path.relative_to(PACKAGE)}: {owner}.{name}")
    assert sorted(found - _KNOWN) == []
    assert sorted(_KNOWN - found) == [], "fixed: drop it from _KNOWN"
