"""The stand-in's memory package: the base class and errors, the factory that resolves
``memory.manager_class`` (a dotted ``package.module:Class`` path) and builds the singleton with
the host hooks, and the LangChain-shaped messages the host hands to ``add``."""

from __future__ import annotations

import importlib
import os
import threading
from pathlib import Path
from typing import Any

from .manager import (
    MemoryCallbacks,
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
    MemoryManagerError,
)

__all__ = [
    "MemoryCallbacks",
    "MemoryConflictError",
    "MemoryCorruptionError",
    "MemoryManager",
    "MemoryManagerError",
    "get_memory_manager",
    "reset_memory_manager",
    "resolve_manager_class",
]

_lock = threading.Lock()
_manager: MemoryManager | None = None


def resolve_manager_class(value: str) -> type[MemoryManager]:
    """A dotted path: split at the first ``:``, else at the last ``.``; never a fallback."""
    if ":" in value:
        module_name, attr = value.split(":", 1)
    else:
        module_name, _, attr = value.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"memory.manager_class {value!r} is not a resolvable 'pkg.mod:Cls' path")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"memory.manager_class {value!r} cannot be resolved: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, MemoryManager)):
        raise ValueError(f"memory.manager_class {value!r} is not a MemoryManager subclass")
    return cls


def _runtime_home() -> Path:
    home = os.environ.get("DEER_FLOW_HOME")
    return Path(home).resolve() if home else (Path.cwd() / ".deer-flow").resolve()


def get_memory_manager(memory_config: dict[str, Any], host_hooks: dict[str, Any]) -> MemoryManager:
    """The process-wide manager, built once (double-checked locking)."""
    global _manager
    if _manager is not None:
        return _manager
    with _lock:
        if _manager is None:
            cls = resolve_manager_class(memory_config.get("manager_class", "deermem"))
            backend_config = dict(memory_config.get("backend_config") or {})
            storage = backend_config.get("storage_path")
            if not storage:
                backend_config["storage_path"] = str(_runtime_home())
            elif not Path(storage).is_absolute():
                backend_config["storage_path"] = str((_runtime_home() / storage).resolve())
            _manager = cls.from_config(
                backend_config, mode=memory_config.get("mode", "middleware"), **host_hooks
            )
    return _manager


def reset_memory_manager() -> None:
    global _manager
    with _lock:
        _manager = None
