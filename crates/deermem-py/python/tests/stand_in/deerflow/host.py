"""The stand-in's host side: LangChain-shaped messages, the host hooks DeerFlow passes to
``from_config``, a middleware-like turn loop (inject the ``<memory>`` block, answer, hand the
turn to ``add``), and the memory router's mapping of manager errors to HTTP statuses."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from .agents.memory import (
    MemoryCallbacks,
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
)

log = logging.getLogger("deerflow.host")

#: The trace id bound on the current thread by ``trace_context_manager``.
current_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "current_trace", default=None
)


@dataclass
class Message:
    """A LangChain-shaped message, read by attribute."""

    type: str
    content: Any
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[Any] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    id: str | None = None


def human(text: Any, **kw: Any) -> Message:
    return Message("human", text, **kw)


def ai(text: Any, **kw: Any) -> Message:
    return Message("ai", text, **kw)


def tool(text: Any, **kw: Any) -> Message:
    return Message("tool", text, **kw)


class RecordingCallbacks(MemoryCallbacks):
    """Records both model-call callbacks and tags the invoke config (as Langfuse does)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []

    def on_memory_llm_call(self, invoke_config, *, thread_id, user_id, trace_id, model_name):
        invoke_config.setdefault("metadata", {})["deerflow_trace_id"] = trace_id
        self.calls.append(
            {
                "thread_id": thread_id,
                "user_id": user_id,
                "trace_id": trace_id,
                "model_name": model_name,
                "bound_trace": current_trace.get(),
            }
        )

    def on_memory_llm_result(self, invoke_config, *, prompt, response, error, duration_ms, model_name):
        self.results.append(
            {
                "config": dict(invoke_config),
                "prompt": prompt,
                "response": response,
                "error": error,
                "duration_ms": duration_ms,
            }
        )


@contextlib.contextmanager
def trace_context_manager(trace_id: str):
    token = current_trace.set(trace_id)
    try:
        yield
    finally:
        current_trace.reset(token)


def should_keep_hidden_message(additional_kwargs: dict[str, Any]) -> bool:
    """Keeps hidden user messages that answer a clarification (the host's rule)."""
    return bool(additional_kwargs.get("human_input_response"))


@dataclass
class Host:
    """A middleware-like agent loop over one memory manager."""

    manager: MemoryManager
    agent: Callable[[str], str]
    histories: dict[str, list[Message]] = field(default_factory=dict)
    prompts: list[str] = field(default_factory=list)

    def turn(
        self,
        thread_id: str,
        user_id: str,
        text: str,
        *,
        agent_name: str | None = None,
        trace_id: str | None = None,
    ) -> str:
        context = self.manager.get_context(user_id, agent_name=agent_name, thread_id=thread_id)
        block = f"<memory>\n{context.strip()}\n</memory>\n" if context.strip() else ""
        prompt = block + text
        self.prompts.append(prompt)
        reply = self.agent(prompt)
        history = self.histories.setdefault(thread_id, [])
        n = len(history)
        history.append(human(text, id=f"{thread_id}-h{n}"))
        history.append(ai(reply, id=f"{thread_id}-a{n}"))
        self.manager.add(
            thread_id, list(history), agent_name=agent_name, user_id=user_id, trace_id=trace_id
        )
        return reply


def route(call: Callable[[], Any]) -> tuple[int, Any]:
    """Runs a manager call the way the memory router does and returns (status, body)."""
    try:
        return 200, call()
    except MemoryConflictError:
        return 409, "Memory changed concurrently; reload and retry."
    except MemoryCorruptionError:
        return 500, "Stored memory data is corrupted."
    except NotImplementedError:
        return 501, "not supported"
    except KeyError as e:
        return 404, f"Memory fact '{e.args[0]}' not found."
    except ValueError as e:
        code = e.args[0] if e.args else ""
        if code == "confidence":
            return 400, "Invalid confidence value; must be between 0 and 1."
        if code == "Duplicate fact":
            return 409, "A fact with the same content already exists."
        return 400, "Memory fact content cannot be empty."
