"""Summaries from any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LiteLLM...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import Unavailable
from ..infra.openai_chat import ChatCompletions, ChatEndpoint
from ..sessions.model import Message, Role
from ..tokens import TokenCounter
from .summarizer import SummaryResult

PROVIDER = "openai"

SYSTEM_PROMPT = (
    "You maintain the rolling summary of a conversation between a user and an AI agent. "
    "You receive the previous summary and the turns that are leaving the agent's context window. "
    "Write the updated summary. Keep verbatim: decisions, constraints, identifiers (ids, order numbers, "
    "numbers, names, email addresses, URLs, dates) and open items (unanswered questions, to-dos). "
    "Drop small talk. Write plain text, no preamble."
)


@dataclass(frozen=True, slots=True)
class OpenAISettings(ChatEndpoint):
    temperature: float = 0.0


class OpenAISummarizer:
    """Calls ``POST {base_url}/chat/completions``. Pass a shared ``httpx.AsyncClient`` or let it own one."""

    def __init__(
        self, settings: OpenAISettings, counter: TokenCounter, client: httpx.AsyncClient | None = None
    ) -> None:
        self._settings = settings
        self._counter = counter
        self._chat = ChatCompletions.to(settings, what="summarizer endpoint", client=client)

    @property
    def provider(self) -> str:
        return PROVIDER

    async def aclose(self) -> None:
        await self._chat.aclose()

    def _prompt(self, previous: str, leaving: list[Message], budget_tokens: int) -> str:
        turns = "\n".join(
            f"[#{m.seq}] {m.participant_name or Role(m.role).name.lower()}: {m.content}"
            for m in leaving
            if m.content.strip()
        )
        return (
            f"Previous summary:\n{previous or '(none)'}\n\n"
            f"Turns leaving the window:\n{turns or '(none)'}\n\n"
            f"Write the updated summary in at most {budget_tokens} tokens."
        )

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        s = self._settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": self._prompt(previous, leaving, budget_tokens)},
            ],
            "max_tokens": max(1, budget_tokens),
            "temperature": s.temperature,
        }
        payload = await self._chat.complete(body)
        try:
            text = str(payload["choices"][0]["message"]["content"] or "").strip()
        except (KeyError, IndexError, TypeError) as exc:
            raise Unavailable(f"summarizer {s.model}: malformed response") from exc
        usage = payload.get("usage") or {}
        # The model may overrun max_tokens in our encoding (different tokenizer); the budget is ours.
        count = self._counter.count(text)
        if count > budget_tokens:
            text = self._counter.truncate(text, budget_tokens)
            count = self._counter.count(text)
        tokens_in = int(
            usage.get("prompt_tokens") or self._counter.count(str(body["messages"][1]["content"]))
        )
        tokens_out = int(usage.get("completion_tokens") or count)
        return SummaryResult(text, count, tokens_in, tokens_out, PROVIDER)
