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


#: What the memory router answers when a write fails with an ``OSError``, by operation.
WRITE_FAILURES = {
    "create": "Failed to create memory fact.",
    "update": "Failed to update memory fact.",
    "delete": "Failed to delete memory fact.",
    "import": "Failed to import memory data.",
    "clear": "Failed to clear memory data.",
}
#: The details of the manager errors the router knows.
CONFLICT = "Memory changed concurrently; reload and retry."
CORRUPTED = "Stored memory data is corrupted."
EVICTED = "Fact was not stored because the configured memory.max_facts capacity policy evicted it"
BAD_CONFIDENCE = "Invalid confidence value; must be between 0 and 1."
NEEDS_AGENT = (
    "An agent name is required for fact operations; user-global memory stores summaries only."
)
DUPLICATE = "A fact with the same content already exists."
EMPTY_CONTENT = "Memory fact content cannot be empty."
#: Starlette's plain-text answer to an exception no handler caught.
UNHANDLED = "Internal Server Error"


def _fact_value_error(e: ValueError) -> tuple[int, str]:
    """The fact routes' reading of a ``ValueError``: its first argument is the code; any code
    the router does not know is reported as empty content."""
    code = e.args[0] if e.args else ""
    if code == "confidence":
        return 400, BAD_CONFIDENCE
    if code == "agent_name":
        return 400, NEEDS_AGENT
    if code == "Duplicate fact":
        return 409, DUPLICATE
    return 400, EMPTY_CONTENT


def route(call: Callable[[], Any], op: str = "get") -> tuple[int, Any]:
    """Runs a manager call the way the memory router's route for ``op`` does and returns
    (status, body): the result on success, else the error detail.

    ``op`` is ``get`` (get, export, status), ``reload``, ``clear``, ``import``, ``create``,
    ``update`` or ``delete``. Every route maps ``MemoryConflictError`` to 409 and
    ``MemoryCorruptionError`` to 500; the write routes map ``OSError`` to a 500 with their
    "Failed to ..." detail; ``create`` and ``update`` read a ``ValueError``'s code (see
    ``_fact_value_error``) and ``update`` and ``delete`` a ``KeyError`` as 404; a create whose
    fact the capacity policy evicted at once is a 409. Anything else escapes the route:
    Starlette's plain 500.
    """
    try:
        result = call()
    except MemoryConflictError:
        return 409, CONFLICT
    except MemoryCorruptionError:
        return 500, CORRUPTED
    except NotImplementedError:
        return 501, "not supported"
    except KeyError as e:
        if op in ("update", "delete"):
            return 404, f"Memory fact '{e.args[0]}' not found."
        return 500, UNHANDLED
    except ValueError as e:
        if op in ("create", "update"):
            return _fact_value_error(e)
        return 500, UNHANDLED
    except OSError:
        if op in WRITE_FAILURES:
            return 500, WRITE_FAILURES[op]
        return 500, UNHANDLED
    except Exception:  # noqa: BLE001 - what no handler catches is Starlette's plain 500
        return 500, UNHANDLED
    if op == "create":
        _, fact_id = result
        if fact_id is None:
            return 409, EVICTED
    return 200, result
