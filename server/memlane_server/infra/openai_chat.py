"""Transport for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LiteLLM...):
one POST with bounded retries, shared by the summarizer and the extractor providers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from ..errors import Unavailable


@dataclass(frozen=True, slots=True)
class ChatEndpoint:
    """An OpenAI-compatible endpoint; the summarizer's and the extractor's settings extend it."""

    base_url: str  # e.g. "https://api.openai.com/v1" (the path /chat/completions is appended)
    model: str
    # From the settings (<provider>_api_key, <provider>_timeout_seconds), which hold their defaults.
    api_key: str
    timeout_s: float
    # Constants of the client, not settings: a connection is up in well under this, or the endpoint is down.
    connect_timeout_s: float = 5.0
    max_retries: int = 1  # on 429/5xx and transport errors; both callers run off the request path


class ChatCompletions:
    """``POST {base_url}/chat/completions``. Pass a shared ``httpx.AsyncClient`` or let it own one."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,  # these two from the endpoint (the settings), which holds the defaults
        timeout_s: float,
        connect_timeout_s: float = 5.0,
        max_retries: int = 1,
        what: str = "chat provider",
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._attempts = max_retries + 1
        self._what = what
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s)
        )

    @classmethod
    def to(
        cls, endpoint: ChatEndpoint, *, what: str, client: httpx.AsyncClient | None = None
    ) -> ChatCompletions:
        return cls(
            endpoint.base_url,
            api_key=endpoint.api_key,
            timeout_s=endpoint.timeout_s,
            connect_timeout_s=endpoint.connect_timeout_s,
            max_retries=endpoint.max_retries,
            what=what,
            client=client,
        )

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """The response body. Retries transport errors, 429 and 5xx (the callers run off the request
        path); raises ``Unavailable`` when the endpoint cannot answer."""
        last = ""
        for attempt in range(self._attempts):
            try:
                resp = await self._client.post(self._url, content=orjson.dumps(body), headers=self._headers)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    try:
                        data = orjson.loads(resp.content)
                    except orjson.JSONDecodeError as exc:
                        raise Unavailable(f"{self._what} sent invalid JSON: {exc}") from exc
                    if not isinstance(data, dict):
                        raise Unavailable(f"{self._what} sent an unexpected body")
                    return data
                last = f"HTTP {resp.status_code}"
                if resp.status_code != 429 and resp.status_code < 500:
                    break  # a 4xx other than 429 (bad key, bad model) will not get better on retry
            if attempt + 1 < self._attempts:
                await asyncio.sleep(0.2 * (attempt + 1))
        raise Unavailable(f"{self._what} failed: {last}")
