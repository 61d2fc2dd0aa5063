"""Summaries from any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LiteLLM...)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from memlane_server.errors import Unavailable
from memlane_server.sessions.model import Message, Role
from memlane_server.tokens import TokenCounter

from .base import SummaryResult

PROVIDER = "openai"

SYSTEM_PROMPT = (
    "You maintain the rolling summary of a conversation between a user and an AI agent. "
    "You receive the previous summary and the turns that are leaving the agent's context window. "
    "Write the updated summary. Keep verbatim: decisions, constraints, identifiers (ids, order numbers, "
    "numbers, names, email addresses, URLs, dates) and open items (unanswered questions, to-dos). "
    "Drop small talk. Write plain text, no preamble."
)


@dataclass(frozen=True, slots=True)
class OpenAISettings:
    base_url: str  # e.g. "https://api.openai.com/v1" (the path /chat/completions is appended)
    model: str
    api_key: str = ""
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    max_retries: int = 1  # on 429/5xx and transport errors; summarization is off the request path
    temperature: float = 0.0


class OpenAISummarizer:
    """Calls ``POST {base_url}/chat/completions``. Pass a shared ``httpx.AsyncClient`` or let it own one."""

    def __init__(
        self, settings: OpenAISettings, counter: TokenCounter, client: httpx.AsyncClient | None = None
    ) -> None:
        self._settings = settings
        self._counter = counter
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.timeout_s, connect=settings.connect_timeout_s)
        )

    @property
    def provider(self) -> str:
        return PROVIDER

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

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
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        url = s.base_url.rstrip("/") + "/chat/completions"
        payload = await self._post(url, body, headers)
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

    async def _post(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        attempts = self._settings.max_retries + 1
        last: str = ""
        for attempt in range(attempts):
            try:
                resp = await self._client.post(url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            else:
                if resp.status_code == 200:
                    try:
                        data = resp.json()
                    except ValueError as exc:
                        raise Unavailable("summarizer: response is not JSON") from exc
                    if not isinstance(data, dict):
                        raise Unavailable("summarizer: response is not a JSON object")
                    return data
                last = f"HTTP {resp.status_code}"
                # 4xx other than 429 will not get better by retrying (bad key, bad model).
                if resp.status_code != 429 and resp.status_code < 500:
                    break
            if attempt + 1 < attempts:
                await asyncio.sleep(0.2 * (attempt + 1))
        raise Unavailable(f"summarizer endpoint failed: {last}")
