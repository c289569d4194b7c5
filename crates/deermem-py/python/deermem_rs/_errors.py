"""The errors DeerFlow's memory router maps to status codes.

When DeerFlow is importable these are DeerFlow's own classes, so ``except MemoryConflictError``
in DeerFlow catches what the engine raises; otherwise same-named classes with the same bases
are defined here, for use outside DeerFlow.
"""

from __future__ import annotations

try:  # pragma: no branch - decided once per process
    from deerflow.agents.memory import (  # type: ignore[import-not-found]
        MemoryConflictError,
        MemoryCorruptionError,
        MemoryManagerError,
    )

    FROM_DEERFLOW = True
except ImportError:
    FROM_DEERFLOW = False

    class MemoryManagerError(RuntimeError):
        """A memory backend failed."""

    class MemoryConflictError(MemoryManagerError):
        """A write lost an optimistic-concurrency race: reload and retry."""

    class MemoryCorruptionError(MemoryManagerError):
        """Persisted memory cannot be read safely; manual repair is needed."""


__all__ = [
    "FROM_DEERFLOW",
    "MemoryConflictError",
    "MemoryCorruptionError",
    "MemoryManagerError",
]
