"""``MemlaneEmbedder``: CrewAI's embedder callable (``texts -> vectors``) served by the sidecar's model
(``Embed``), so CrewAI and memlane's long-term memory embed with one model and a CrewAI query vector
can be searched in memlane."""

from __future__ import annotations

from memlane import Client

_BATCH = 256  # Embed's largest batch


class MemlaneEmbedder:
    def __init__(self, target: str | Client = "127.0.0.1:50051", *, token: str | None = None) -> None:
        self.client = target if isinstance(target, Client) else Client(target, token=token)
        self._owns_client = not isinstance(target, Client)

    def __call__(self, input: list[str]) -> list[list[float]]:  # the name CrewAI's embedders use
        out: list[list[float]] = []
        for i in range(0, len(input), _BATCH):
            reply = self.client.embed(texts=input[i : i + _BATCH])
            out.extend(list(e.values) for e in reply.embeddings)
        return out

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
