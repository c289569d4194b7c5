"""DeerMem long-term memory for DeerFlow, on the Rust engine.

DeerFlow loads it as its memory manager::

    memory:
      manager_class: deermem_rs:DeerMemManager
      backend_config: { storage_path: ..., ... }   # the same keys as DeerMem's

The storage root is the one DeerMem uses, so switching ``manager_class`` between ``deermem``
and ``deermem_rs:DeerMemManager`` keeps every fact, summary and revision. Log records go to
the ``deermem_rs`` logger.
"""

from ._errors import MemoryConflictError, MemoryCorruptionError, MemoryManagerError
from ._manager import DeerMemManager
from ._native import ENGINE_VERSION

__version__ = ENGINE_VERSION

__all__ = [
    "DeerMemManager",
    "MemoryConflictError",
    "MemoryCorruptionError",
    "MemoryManagerError",
]
