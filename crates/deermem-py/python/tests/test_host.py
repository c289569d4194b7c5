"""The package inside a DeerFlow-shaped host: the factory resolves
``deermem_rs:DeerMemManager`` from ``memory.manager_class`` and builds it with the host hooks,
a middleware-like loop runs turns whose extraction a scripted host model answers, the
``<memory>`` block reaches the next prompt, and every router operation gets the Python
DeerMem's shapes and status codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from deerflow.agents.memory import get_memory_manager, reset_memory_manager, resolve_manager_class
from deerflow.host import (
    Host,
    RecordingCallbacks,
    current_trace,
    route,
    should_keep_hidden_message,
    trace_context_manager,
)
from helpers import ScriptedModel, fact, prompt_text, update

import deermem_rs


@pytest.fixture
def host_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DEER_FLOW_HOME", str(tmp_path / "home"))
    reset_memory_manager()
    yield tmp_path / "home"
    reset_memory_manager()


def build(model: ScriptedModel, metrics: list, callbacks: RecordingCallbacks, **memory):
    cfg = {
        "manager_class": "deermem_rs:DeerMemManager",
        "backend_config": {"storage_path": "memory", "token_counting": "char"},
    }
    cfg.update(memory)
    hooks = {
        "callbacks": callbacks,
        "should_keep_hidden_message": should_keep_hidden_message,
        "trace_context_manager": trace_context_manager,
        "host_llm_factory": lambda: model,
        "extraction_callback": metrics.append,
    }
    return get_memory_manager(cfg, hooks)


def test_both_spellings_of_the_dotted_path_resolve_to_the_class():
    assert resolve_manager_class("deermem_rs:DeerMemManager") is deermem_rs.DeerMemManager
    assert resolve_manager_class("deermem_rs.DeerMemManager") is deermem_rs.DeerMemManager


def test_the_host_invariant_check_is_real_and_the_class_passes_it(tmp_path):
    # A subclass whose flag contradicts its search() is refused by the same check.
    class Inconsistent(deermem_rs.DeerMemManager):
        supports_search = False

    with pytest.raises(ValueError, match="inconsistent"):
        Inconsistent.from_config({"storage_path": str(tmp_path)})
    ok = deermem_rs.DeerMemManager.from_config({"storage_path": str(tmp_path)}, mode="tool")
    ok.close()


def test_a_host_runs_turns_with_its_own_model_and_injects_memory(host_env):
    model = ScriptedModel(
        [
            update(
                fact("User prefers Rust for backend services"),
                fact("User is a backend engineer on the payments team", "context", 0.95),
                user={
                    "workContext": {
                        "summary": "Backend engineer on payments.",
                        "shouldUpdate": True,
                        "scope": "user",
                        "authority": "descriptive",
                    }
                },
            )
        ]
    )
    metrics: list = []
    callbacks = RecordingCallbacks()
    manager = build(model, metrics, callbacks)
    assert isinstance(manager, deermem_rs.DeerMemManager)
    assert get_memory_manager({}, {}) is manager, "the factory keeps one manager"
    root = host_env / "memory"
    assert Path(manager.backend_config["storage_path"]) == root.resolve()

    answers = []
    host = Host(manager, agent=lambda prompt: answers.append(prompt) or "Sounds good.")
    host.turn(
        "th-1",
        "erin@example.com",
        "I'm a backend engineer on the payments team and I prefer Rust.",
        trace_id="trace-42",
    )
    assert "<memory>" not in answers[0], "nothing to inject before the first extraction"
    assert manager.shutdown_flush(30) is True

    # The host model saw the conversation, with the invoke config the callbacks tagged.
    assert len(model.calls) == 1
    prompt, invoke_config = model.calls[0]
    assert "prefer Rust" in prompt_text(prompt)
    assert invoke_config["run_name"] == "memory_agent"
    assert invoke_config["metadata"]["deerflow_trace_id"] == "trace-42"
    (call,) = callbacks.calls
    assert call == {
        "thread_id": "th-1",
        "user_id": "erin@example.com",
        "trace_id": "trace-42",
        "model_name": None,
        "bound_trace": "trace-42",
    }
    (result,) = callbacks.results
    assert result["error"] is None and result["response"].content.startswith("{")
    assert result["duration_ms"] >= 0

    # The extraction metrics, with the reference's keys.
    (m,) = metrics
    assert m["success"] is True and m["thread_id"] == "th-1" and m["trace_id"] == "trace-42"
    assert m["user_id"] == "erin@example.com" and m["model_name"] is None
    assert m["facts_extracted"] == 2 and m["facts_passed_confidence"] == 2
    assert m["facts_passed_scope_gate"] == 2 and m["rejected_by_scope_gate"] == 0
    assert m["rejected_low_confidence"] == 0
    assert set(m["scope_gate_rejections"]) == {"facts", "summaries", "removals", "consolidations"}
    assert m["token_usage"] == {"input_tokens": 120, "output_tokens": 30, "total_tokens": 150}

    # The next turn's prompt carries the <memory> block.
    host.turn("th-1", "erin@example.com", "What language should I use?")
    second = answers[1]
    assert second.startswith("<memory>\n") and "</memory>\n" in second
    assert "User prefers Rust for backend services" in second
    assert "Backend engineer on payments." in second

    # The files are where DeerMem keeps them.
    assert list((root / "users").glob("erin-example-com-*/agents/__default__/facts/*/*.md"))


def test_every_router_operation_has_the_reference_shapes_and_statuses(host_env):
    manager = build(ScriptedModel(), [], RecordingCallbacks())
    user = "frank"
    status, doc = route(lambda: manager.get_memory(user_id=user))
    assert status == 200 and doc["facts"] == [] and doc["version"] == "1.0"
    status, created = route(
        lambda: manager.create_fact(content="User bikes to work", category="context", confidence=0.7, user_id=user),
        "create",
    )
    assert status == 200
    doc, fid = created
    assert [f["id"] for f in doc["facts"]] == [fid]
    assert route(lambda: manager.update_fact(fact_id=fid, content=None, category=None, confidence=0.9, user_id=user), "update")[1]["facts"][0]["confidence"] == 0.9
    assert route(lambda: manager.update_fact(fact_id="fact_00000000", content="x", user_id=user), "update")[0] == 404
    assert route(lambda: manager.create_fact(content="User bikes to work", user_id=user), "create")[0] == 409
    assert route(lambda: manager.create_fact(content="x", confidence=3.0, user_id=user), "create") == (
        400,
        "Invalid confidence value; must be between 0 and 1.",
    )
    assert route(lambda: manager.create_fact(content="   ", user_id=user), "create")[0] == 400
    exported = route(lambda: manager.get_memory(user_id=user))[1]
    status, reloaded = route(lambda: manager.reload_memory(user_id=user), "reload")
    assert status == 200 and reloaded["facts"] == exported["facts"]
    status, imported = route(lambda: manager.import_memory(exported, user_id=user), "import")
    assert status == 200 and [f["id"] for f in imported["facts"]] == [fid]
    assert route(lambda: manager.delete_fact(fid, user_id=user), "delete")[1]["facts"] == []
    assert route(lambda: manager.delete_fact(fid, user_id=user), "delete")[0] == 404
    status, cleared = route(lambda: manager.clear_memory(user_id=user), "clear")
    assert status == 200 and cleared["facts"] == []
    assert route(lambda: manager.delete_memory(user_id=user))[0] == 501


def test_tool_mode_host_injects_summaries_only_and_searches_facts(host_env):
    manager = build(ScriptedModel(), [], RecordingCallbacks(), mode="tool")
    assert manager.mode == "tool"
    manager.create_fact("User speaks Portuguese", "identity", 0.9, user_id="gia")
    assert "Portuguese" not in manager.get_context("gia")
    assert [f["content"] for f in manager.search("Portuguese", user_id="gia")] == [
        "User speaks Portuguese"
    ]


def test_trace_binding_is_restored_after_the_call(host_env):
    model = ScriptedModel([update(fact("User writes Haskell at work"))])
    callbacks = RecordingCallbacks()
    manager = build(model, [], callbacks)
    Host(manager, agent=lambda p: "ok").turn("th-2", "hana", "I write Haskell at work.", trace_id="tr-9")
    assert manager.shutdown_flush(30)
    assert callbacks.calls[0]["bound_trace"] == "tr-9"
    assert current_trace.get() is None
