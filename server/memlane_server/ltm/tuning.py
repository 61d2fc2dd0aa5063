"""Tuning knobs of long-term memory, with the defaults the golden set was measured with.

``wiring/`` builds one ``MemoryTuning`` from ``Settings``; the domain never reads the environment. A
knob that is a setting has no default here (the setting holds it, written once); the rest are constants
of the ranking and upkeep that no deployment changes, so they keep their measured defaults here.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_MS = 86_400_000
# Recall expansion's weight when the setting ltm_recall_expansion is on (measured; not a setting).
EXPANSION_WEIGHT = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTuning:
    # Caps: per (user, agent). Episodes are many and cheap, so they get their own, larger cap.
    # (settings: ltm_max_items_per_agent, ltm_max_episodes_per_agent)
    max_items_per_agent: int
    max_episodes_per_agent: int
    # Conflicts: cosine at or above this, same user/agent/kind, is "the same thing said again".
    # (setting: ltm_duplicate_similarity)
    duplicate_similarity: float
    # A paraphrase that names nothing the other does not ("User lives in Lyon." / "Lives in Lyon,
    # France."): one item at this cosine or above (conflicts.py).
    paraphrase_similarity: float = 0.75
    # An item without a slot states a slot's attribute at this cosine to its description (slots.py).
    slot_similarity: float = 0.5
    # Recall score factor of an episode whose fact was superseded (it says what is no longer true).
    stale_episode_factor: float = 0.5
    # Recall: candidates fetched from each retriever before fusion and re-ranking.
    candidates: int = 40
    # A small k keeps first places far apart: each retriever's top hit is usually the one that matters.
    rrf_k: float = 4.0
    # Weight of each retriever's ranks in the fusion. Full text leads: exact names, ids and rare words
    # are the strongest evidence a memory has; cosine fills in paraphrases. (Measured on the golden set
    # and a conversational recall benchmark; see docs/benchmarks.md.)
    keyword_weight: float = 1.5
    vector_weight: float = 1.0
    # Weight of the sub-queries' lists (ltm/recall.py), shared between them; 0 turns expansion off.
    # Follows the setting ltm_recall_expansion (wiring/: EXPANSION_WEIGHT when on, 0 when off).
    expansion_weight: float
    recency_half_life_days: float = 60.0
    # Final score = fused * (base + w_recency*recency + w_usage*usage + w_importance*importance).
    # Multiplicative so popularity can re-order relevant items but never lift an irrelevant one.
    weight_base: float = 0.6
    weight_recency: float = 0.1
    weight_usage: float = 0.1
    weight_importance: float = 0.2
    usage_saturation: int = 20  # usage_count at which the usage part reaches 1.0
    # Profile injected every turn (setting: ltm_profile_max_items).
    profile_max_items: int
    profile_max_chars: int = 2000
    # Feedback.
    useful_importance_step: float = 0.1
    wrong_importance_step: float = 0.3
    # Pruning job.
    unused_ttl_days: float = 180.0  # never-used, unimportant items older than this die
    unused_keep_importance: float = 0.8  # ...unless at least this important
    retired_retention_days: float = 365.0  # superseded/wrong items kept this long for audit
    max_source_ids: int = 64  # provenance ids kept on a merged item
