"""The stand-in's ``MemoryManager`` base, built from the memory-manager contract: a pydantic
model with three fields, two class-level capability flags, an invariant check on every
construction path, three tiers of methods with their defaults, and the backend-neutral
errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class MemoryManagerError(RuntimeError):
    """A memory backend failed."""


class MemoryConflictError(MemoryManagerError):
    """A write lost a revision race."""


class MemoryCorruptionError(MemoryManagerError):
    """Persisted memory cannot be read safely."""


class MemoryCallbacks:
    """Observability hooks around the memory model call; both are no-ops."""

    def on_memory_llm_call(
        self,
        invoke_config: dict[str, Any],
        *,
        thread_id: str | None,
        user_id: str | None,
        trace_id: str | None,
        model_name: str | None,
    ) -> None:
        return None

    def on_memory_llm_result(
        self,
        invoke_config: dict[str, Any],
        *,
        prompt: Any,
        response: Any,
        error: BaseException | None,
        duration_ms: float,
        model_name: str | None,
    ) -> None:
        return None


def _overrides_search(cls: type) -> bool:
    return getattr(cls, "search") is not MemoryManager.search


class MemoryManager(BaseModel, ABC):
    """The contract every memory backend implements."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend_config: dict[str, Any] = Field(default_factory=dict)
    mode: Literal["middleware", "tool"] = "middleware"
    callbacks: MemoryCallbacks | None = None

    supports_search: ClassVar[bool] = False
    requires_passive_writes_in_tool_mode: ClassVar[bool] = False

    @field_validator("backend_config", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="after")
    def _check_invariants(self) -> MemoryManager:
        cls = type(self)
        overrides = _overrides_search(cls)
        if bool(cls.supports_search) != overrides:
            raise ValueError(
                f"{cls.__name__}: supports_search={cls.supports_search} is inconsistent with "
                f"whether search() is overridden ({overrides})"
            )
        if self.mode == "tool" and not overrides:
            raise ValueError(f"{cls.__name__} cannot run in tool mode: it has no search()")
        return self

    # Tier 1.
    @abstractmethod
    def add(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None: ...

    @abstractmethod
    def get_context(
        self, user_id: str | None, *, agent_name: str | None = None, thread_id: str | None = None
    ) -> str: ...

    @classmethod
    @abstractmethod
    def from_config(
        cls, backend_config: dict[str, Any], *, mode: str = "middleware", **host_hooks: Any
    ) -> MemoryManager: ...

    def _unsupported(self, op: str) -> NotImplementedError:
        return NotImplementedError(f"{op} not supported by {type(self).__name__}")

    # Tier 2.
    def add_nowait(self, thread_id, messages, *, agent_name=None, user_id=None) -> None:
        self.add(thread_id, messages, agent_name=agent_name, user_id=user_id)

    def search(self, query, top_k=5, *, user_id=None, agent_name=None, category=None):
        raise self._unsupported("search")

    def get_memory(self, *, user_id=None, agent_name=None):
        raise self._unsupported("get_memory")

    def delete_memory(self, *, user_id=None, agent_name=None):
        raise self._unsupported("delete_memory")

    def clear_memory(self, *, user_id=None, agent_name=None):
        raise self._unsupported("clear_memory")

    def import_memory(self, memory_data, *, user_id=None, agent_name=None):
        raise self._unsupported("import_memory")

    def export_memory(self, *, user_id=None, agent_name=None):
        raise self._unsupported("export_memory")

    def shutdown_flush(self, timeout: float) -> bool:
        return True

    # Tier 3.
    def warm(self) -> bool | None:
        return None

    def reload_memory(self, *, user_id=None, agent_name=None):
        raise self._unsupported("reload_memory")

    def create_fact(self, content, category="context", confidence=0.5, *, agent_name=None, user_id=None):
        raise self._unsupported("create_fact")

    def delete_fact(self, fact_id, *, agent_name=None, user_id=None):
        raise self._unsupported("delete_fact")

    def update_fact(
        self, fact_id, content=None, category=None, confidence=None, *, agent_name=None, user_id=None
    ):
        raise self._unsupported("update_fact")

    def on_pre_compress(self, messages) -> str:
        return ""

    def on_turn_start(self, turn_number: int, message: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None

    # Async variants: the defaults just call the sync methods.
    async def aadd(self, thread_id, messages, *, agent_name=None, user_id=None, trace_id=None):
        self.add(thread_id, messages, agent_name=agent_name, user_id=user_id, trace_id=trace_id)

    async def aget_context(self, user_id, *, agent_name=None, thread_id=None):
        return self.get_context(user_id, agent_name=agent_name, thread_id=thread_id)

    async def asearch(self, query, top_k=5, *, user_id=None, agent_name=None, category=None):
        return self.search(query, top_k, user_id=user_id, agent_name=agent_name, category=category)
