"""A scripted host chat model and small helpers for the deermem_rs suite."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Answer:
    """What a LangChain chat model returns: ``content`` and optional ``usage_metadata``."""

    content: Any
    usage_metadata: dict[str, int] | None = None


def fact(content: str, category: str = "preference", confidence: float = 0.9) -> dict[str, Any]:
    """A durable, user-scoped fact proposal in the extraction answer's shape."""
    return {
        "content": content,
        "category": category,
        "confidence": confidence,
        "scope": "user",
        "durability": "durable",
        "authority": "descriptive",
    }


def update(*facts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An extraction answer adding ``facts``."""
    out: dict[str, Any] = {"user": {}, "history": {}, "newFacts": list(facts)}
    out.update(extra)
    return out


@dataclass
class ScriptedModel:
    """A host chat model answering each ``invoke`` with the next scripted reply (a dict is sent
    as JSON; a callable gets the prompt; an exception instance is raised)."""

    replies: list[Any] = field(default_factory=list)
    calls: list[tuple[Any, Any]] = field(default_factory=list)
    delay: float = 0.0
    model_name: str = "scripted-host-model"
    finished: threading.Event = field(default_factory=threading.Event)

    def invoke(self, prompt: Any, config: Any = None) -> Answer:
        self.calls.append((prompt, config))
        if self.delay:
            time.sleep(self.delay)
        reply: Any = self.replies.pop(0) if self.replies else update()
        if isinstance(reply, BaseException):
            self.finished.set()
            raise reply
        if callable(reply):
            reply = reply(prompt)
        text = reply if isinstance(reply, str) else json.dumps(reply)
        self.finished.set()
        return Answer(text, {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150})


def prompt_text(prompt: Any) -> str:
    """The text of a prompt given to the host model (dicts or message objects)."""
    parts = []
    for m in prompt:
        parts.append(m["content"] if isinstance(m, dict) else m.content)
    return "\n".join(parts)


def turn(user_text: str, reply: str = "Noted.", thread: str = "t", n: int = 0) -> list[dict[str, Any]]:
    """A user turn and the assistant's answer as plain message dicts."""
    return [
        {"role": "user", "content": user_text, "id": f"{thread}-u{n}"},
        {"role": "assistant", "content": reply, "id": f"{thread}-a{n}"},
    ]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Polls ``predicate`` until true or ``timeout`` seconds pass (for background work whose
    completion has no other signal); returns the last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
