"""The ``Embedder`` protocol: what the rest of the server needs from a sentence embedding model."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalized float32 vectors of ``ndims`` dimensions.

    ``embed`` never blocks the event loop: implementations run the model on their own bounded executor.
    Because the vectors are unit length, a dot product is the cosine similarity.
    """

    @property
    def ndims(self) -> int: ...

    async def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Return an array of shape ``[len(texts), ndims]``; row ``i`` embeds ``texts[i]``."""
        ...

    async def close(self) -> None:
        """Stop the executor; pending calls finish first."""
        ...

    def forget_cached(self) -> None:
        """Drop every cached text and vector (queries hold users' words; erasure clears them)."""
        ...
