"""``DeerMemManager``: the memory manager DeerFlow loads, on the Rust engine.

Every method is a thin call into the native engine (``deermem_rs._native.Engine``), which
releases the GIL for the whole engine call. When DeerFlow is importable the class subclasses
DeerFlow's ``MemoryManager`` (a pydantic model) and passes its invariant check; otherwise it
is a plain class with the same fields and methods.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, ClassVar

from . import _native

logger = logging.getLogger("deermem_rs")

#: Hook names DeerMem also accepts inside ``backend_config`` (they win over the keyword hooks).
_CONFIG_HOOKS = (
    "extraction_callback",
    "should_keep_hidden_message",
    "trace_context_manager",
    "host_llm",
)
#: The keyword hooks of ``from_config`` this backend uses.
_HOST_HOOKS = (
    "callbacks",
    "should_keep_hidden_message",
    "trace_context_manager",
    "host_llm_factory",
    "extraction_callback",
)

#: The keyword hooks of the ``from_config`` call constructing an instance on this thread.
_constructing = threading.local()


def _host_base() -> Any:
    """DeerFlow's ``MemoryManager`` when DeerFlow is importable, else ``None``."""
    try:
        from deerflow.agents.memory.manager import MemoryManager  # type: ignore[import-not-found]

        return MemoryManager
    except ImportError:
        pass
    try:
        from deerflow.agents.memory import MemoryManager  # type: ignore[import-not-found]

        return MemoryManager
    except ImportError:
        return None


def _open_engine(
    backend_config: dict[str, Any] | None,
    mode: str,
    callbacks: Any,
    hooks: dict[str, Any],
) -> _native.Engine:
    """Joins (or builds) the engine of this configuration with these hooks."""
    if backend_config is not None and not isinstance(backend_config, dict):
        raise TypeError("backend_config must be a dict")
    config = dict(backend_config or {})
    for key in ("storage_path", "patterns_dir", "prompts_dir"):
        if isinstance(config.get(key), os.PathLike):
            config[key] = os.fspath(config[key])
    chosen: dict[str, Any] = {}
    for key in _CONFIG_HOOKS:
        if key in config:
            chosen[key] = config.pop(key)
    for key in ("should_keep_hidden_message", "trace_context_manager", "extraction_callback"):
        if chosen.get(key) is None and hooks.get(key) is not None:
            chosen[key] = hooks[key]
    host_llm = chosen.pop("host_llm", None)
    model = config.get("model")
    configured_model = isinstance(model, dict) and bool(model.get("model"))
    factory = hooks.get("host_llm_factory")
    if host_llm is None and not configured_model and factory is not None:
        try:
            host_llm = factory()
        except Exception:  # a hook never breaks construction
            logger.warning(
                "host_llm_factory raised; extraction uses the offline rules", exc_info=True
            )
    _native.refresh_log_level()
    return _native.Engine(config, mode, callbacks=callbacks, host_llm=host_llm, **chosen)


class _Methods:
    """The contract's methods, shared by the DeerFlow subclass and the plain class."""

    supports_search: ClassVar[bool] = True
    requires_passive_writes_in_tool_mode: ClassVar[bool] = False

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_config(
        cls, backend_config: dict[str, Any] | None, *, mode: str = "middleware", **host_hooks: Any
    ) -> Any:
        """Builds the manager from DeerMem's ``backend_config`` and DeerFlow's host hooks
        (``callbacks``, ``should_keep_hidden_message``, ``trace_context_manager``,
        ``host_llm_factory``, ``extraction_callback``); other hooks are ignored."""
        unused = sorted(set(host_hooks) - set(_HOST_HOOKS))
        if unused:
            logger.debug("ignoring host hooks this backend does not use: %s", unused)
        previous = getattr(_constructing, "hooks", None)
        _constructing.hooks = host_hooks
        try:
            return cls(
                backend_config=backend_config if backend_config is not None else {},
                mode=mode,
                callbacks=host_hooks.get("callbacks"),
            )
        finally:
            _constructing.hooks = previous

    def _start(self) -> None:
        hooks = getattr(_constructing, "hooks", None) or {}
        engine = _open_engine(self.backend_config, self.mode, self.callbacks, hooks)
        # In the instance dict itself: every call reads it, and a pydantic private attribute
        # would go through the model's ``__getattr__`` each time.
        self.__dict__["_engine"] = engine

    # -- tier 1 -----------------------------------------------------------------------------

    def add(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None:
        """Queues a conversation turn for extraction (debounced, asynchronous)."""
        self._engine.add(thread_id, messages, agent_name, user_id, trace_id)

    def get_context(
        self, user_id: str | None, *, agent_name: str | None = None, thread_id: str | None = None
    ) -> str:
        """The text to inject inside ``<memory>``, within the token budget, or ``""``."""
        return self._engine.get_context(user_id, agent_name, thread_id)

    # -- tier 2 -----------------------------------------------------------------------------

    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        """The emergency path (before summarisation drops messages): processed at once."""
        self._engine.add(thread_id, messages, agent_name, user_id, None, True)

    def search(
        self,
        query: str,
        top_k: int = 5,
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        category: str | None = None,
        mode: str | None = None,
    ) -> list[dict[str, Any]]:
        """Up to ``top_k`` facts ranked for ``query`` (category filtered before the cut).

        ``mode`` is ``"bm25"`` (words), ``"vector"`` (meaning) or ``"hybrid"`` (both); ``None``
        takes the configured ``search.mode``. The vector modes need ``backend_config.embedding``
        (``ValueError`` otherwise, as for an unknown mode).
        """
        return self._engine.search(query, top_k, user_id, agent_name, category, mode)

    def get_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """The memory document (summaries and the bucket's facts)."""
        return self._engine.get_memory(user_id, agent_name)

    def delete_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> None:
        """Not supported by DeerMem: raises ``NotImplementedError``."""
        self._engine.delete_memory(user_id, agent_name)

    def clear_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """Without an agent: every fact and the summaries; with one: that bucket's facts."""
        return self._engine.clear_memory(user_id, agent_name)

    def import_memory(
        self,
        memory_data: dict[str, Any],
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
    ) -> dict[str, Any]:
        """Replaces the bucket with ``memory_data`` (the export shape); returns the result."""
        return self._engine.import_memory(memory_data, user_id, agent_name)

    def export_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """The export document (the same as ``get_memory``)."""
        return self._engine.export_memory(user_id, agent_name)

    def shutdown_flush(self, timeout: float) -> bool:
        """Drains pending updates within ``timeout`` seconds (hard); true when it finished."""
        return self._engine.shutdown_flush(float(timeout))

    # -- tier 3 -----------------------------------------------------------------------------

    def warm(self) -> bool | None:
        """Warms the token counter: true when ready, false when warming failed."""
        return self._engine.warm()

    def warm_retrieval(self) -> bool:
        """Rebuilds the derived search index from the fact files; false on failure."""
        return self._engine.warm_retrieval()

    def reload_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """Re-reads storage (out-of-band edits) and returns the document."""
        return self._engine.reload_memory(user_id, agent_name)

    def create_fact(
        self,
        content: str,
        category: str = "context",
        confidence: float = 0.5,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        """Creates a fact: ``(document, fact_id)``, the id ``None`` when the capacity policy
        evicted the new fact at once (nothing was stored)."""
        return self._engine.create_fact(content, category, confidence, user_id, agent_name)

    def update_fact(
        self,
        fact_id: str,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        """Changes the given fields of a fact (``KeyError`` when it does not exist)."""
        return self._engine.update_fact(fact_id, content, category, confidence, user_id, agent_name)

    def delete_fact(
        self, fact_id: str, *, agent_name: str | None = None, user_id: str | None = None
    ) -> dict[str, Any]:
        """Deletes a fact (``KeyError`` when it does not exist)."""
        return self._engine.delete_fact(fact_id, user_id, agent_name)

    def on_pre_compress(self, messages: list[Any]) -> str:
        """Nothing to keep before the host compresses a conversation."""
        return ""

    def on_turn_start(self, turn_number: int, message: Any, **kwargs: Any) -> None:
        """Nothing to do at the start of a turn."""
        return None

    def close(self) -> None:
        """Releases this manager's hold on the engine (closed when no other holds it)."""
        self._engine.close()

    # -- async ------------------------------------------------------------------------------
    # Run on a worker thread (with the caller's context variables), so the event loop never
    # waits for storage, the index or a hook.

    async def aadd(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None:
        """``add`` off the event loop."""
        await asyncio.to_thread(
            self.add,
            thread_id,
            messages,
            agent_name=agent_name,
            user_id=user_id,
            trace_id=trace_id,
        )

    async def aget_context(
        self, user_id: str | None, *, agent_name: str | None = None, thread_id: str | None = None
    ) -> str:
        """``get_context`` off the event loop."""
        return await asyncio.to_thread(
            self.get_context, user_id, agent_name=agent_name, thread_id=thread_id
        )

    async def asearch(
        self,
        query: str,
        top_k: int = 5,
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        category: str | None = None,
    ) -> list[dict[str, Any]]:
        """``search`` off the event loop."""
        return await asyncio.to_thread(
            self.search,
            query,
            top_k,
            user_id=user_id,
            agent_name=agent_name,
            category=category,
        )


_HostBase = _host_base()

if _HostBase is not None:

    class DeerMemManager(_Methods, _HostBase):  # type: ignore[misc, valid-type]
        """DeerMem on the Rust engine, as a DeerFlow ``MemoryManager``."""

        supports_search: ClassVar[bool] = True
        requires_passive_writes_in_tool_mode: ClassVar[bool] = False
        # Bound in the class itself too, for a host that inspects the class's own namespace
        # to decide whether ``search`` is overridden.
        search = _Methods.search

        def model_post_init(self, context: Any, /) -> None:
            super().model_post_init(context)
            self._start()

else:

    class DeerMemManager(_Methods):  # type: ignore[no-redef]
        """DeerMem on the Rust engine, outside DeerFlow (the same fields and methods)."""

        def __init__(
            self,
            backend_config: dict[str, Any] | None = None,
            mode: str = "middleware",
            callbacks: Any = None,
        ) -> None:
            if mode not in ("middleware", "tool"):
                raise ValueError(f"mode must be 'middleware' or 'tool', not {mode!r}")
            self.backend_config: dict[str, Any] = (
                backend_config if backend_config is not None else {}
            )
            self.mode = mode
            self.callbacks = callbacks
            self._start()

        def __repr__(self) -> str:
            return f"DeerMemManager(mode={self.mode!r}, backend_config={self.backend_config!r})"


__all__ = ["DeerMemManager"]
