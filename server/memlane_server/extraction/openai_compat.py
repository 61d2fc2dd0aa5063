"""``OpenAIExtractor``: memories from any OpenAI-compatible chat-completions endpoint.

Strict JSON-schema output at temperature 0, so the reply parses or the call fails loudly. Whatever the
model returns then goes through the same screen as the rules (PII, greetings, questions), and its
provenance is checked: a memory may only cite message ids it was shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from ..errors import Unavailable
from ..infra.openai_chat import ChatCompletions, ChatEndpoint
from ..memory_kinds import STATED_KINDS
from ..sessions.model import Message, Role, Session
from .extractor import ExtractedMemory, ExtractionResult, screen
from .keywords import keywords as fallback_keywords

PROVIDER = "openai"

SYSTEM_PROMPT = (
    "You extract durable long-term memories about the USER from a conversation. Return only facts worth "
    "remembering for future conversations: personal facts (name, location, job, family, diet), preferences "
    "(including units), standing instructions to the assistant (always/never/from now on), and decisions. "
    "Write each memory as one short third-person sentence ('User lives in Pune.'). Never store greetings, "
    "acknowledgements, questions, restatements, or anything the assistant said that the user did not "
    "confirm. Never store personal data such as emails, phone numbers, card numbers, IBANs, national ids, "
    "passwords, API keys or street addresses. For a single-valued attribute set `slot` (e.g. 'location', "
    "'units', 'name', 'job', 'diet'); otherwise an empty string. `source_message_ids` must list the ids "
    "(shown in brackets) of the user messages the memory comes from. Return an empty list if nothing "
    "qualifies."
)

RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["memories"],
    "properties": {
        "memories": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "content", "keywords", "slot", "importance", "source_message_ids"],
                "properties": {
                    "kind": {"type": "string", "enum": [k.value for k in STATED_KINDS]},
                    "content": {"type": "string"},
                    "keywords": {"type": "array", "items": {"type": "string"}},
                    "slot": {"type": "string"},
                    "importance": {"type": "number"},
                    "source_message_ids": {"type": "array", "items": {"type": "string"}},
                },
            },
        }
    },
}


@dataclass(frozen=True, slots=True)
class OpenAIExtractorSettings(ChatEndpoint):
    max_transcript_chars: int = 24_000


class OpenAIExtractor:
    """Implements ``Extractor``. Pass a shared ``httpx.AsyncClient`` or let it own one."""

    def __init__(self, settings: OpenAIExtractorSettings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._chat = ChatCompletions.to(settings, what="extraction provider", client=client)

    @property
    def provider(self) -> str:
        return PROVIDER

    async def aclose(self) -> None:
        await self._chat.aclose()

    def _transcript(self, messages: list[Message]) -> str:
        lines = [
            f"[{m.message_id}] {'user' if m.role is Role.USER else 'assistant'}: {m.content.strip()}"
            for m in messages
            if m.role in (Role.USER, Role.ASSISTANT) and not m.transient and m.content.strip()
        ]
        text = "\n".join(lines)
        # Keep the end: at session end the latest statements are the ones that stand.
        return text[-self._settings.max_transcript_chars :]

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult:
        transcript = self._transcript(messages)
        if not transcript:
            return ExtractionResult()
        s = self._settings
        body = {
            "model": s.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": transcript},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "memories", "strict": True, "schema": RESPONSE_SCHEMA},
            },
        }
        payload = await self._chat.complete(body)
        return self._parse(payload, messages)

    def _parse(self, payload: dict[str, Any], messages: list[Message]) -> ExtractionResult:
        usage = payload.get("usage") or {}
        result = ExtractionResult(
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
        )
        try:
            content = payload["choices"][0]["message"]["content"]
            parsed = orjson.loads(content)
            raw = parsed["memories"]
        except (KeyError, IndexError, TypeError, orjson.JSONDecodeError) as exc:
            raise Unavailable(f"extraction provider reply does not match the schema: {exc}") from exc
        by_id = {m.message_id: m for m in messages}
        user_ids = {m.message_id for m in messages if m.role is Role.USER}
        for entry in raw if isinstance(raw, list) else []:
            if not isinstance(entry, dict):
                continue
            kind = str(entry.get("kind", ""))
            text = str(entry.get("content", "")).strip()
            if kind not in STATED_KINDS or not text:
                result.rejected_picky += 1
                continue
            sources = [str(i) for i in entry.get("source_message_ids") or [] if str(i) in user_ids]
            if not sources:
                # No provenance in the user's own words: the model may be repeating the assistant.
                result.rejected_picky += 1
                continue
            words = [str(k) for k in entry.get("keywords") or [] if str(k).strip()]
            result.memories.append(
                ExtractedMemory(
                    kind=kind,
                    content=text,
                    keywords=words[:16] or fallback_keywords(text),
                    slot=str(entry.get("slot") or "").strip().lower(),
                    importance=min(1.0, max(0.0, float(entry.get("importance") or 0.5))),
                    source_message_ids=sources,
                    occurred_at_ms=by_id[sources[0]].created_at_ms,
                )
            )
        return screen(result)
