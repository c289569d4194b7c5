"""The host hooks: which ones are used and when, and that a hook that raises is logged on
the ``deermem_rs`` logger and never breaks a turn."""

from __future__ import annotations

import logging

import pytest
from conftest import config
from deerflow.host import RecordingCallbacks, ai, human
from helpers import ScriptedModel, fact, prompt_text, turn, update


def hook_warnings(caplog, hook: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "deermem_rs" and r.levelno == logging.WARNING and hook in r.getMessage()
    ]


def boom(*args, **kwargs):
    raise RuntimeError("hook exploded")


HIDDEN = {"hide_from_ui": True, "marker": "clarification"}


def hidden_turn(text: str):
    return [
        human("Which database should I use for the ledger?", id="h0"),
        ai("Postgres or SQLite?", id="a0"),
        human(text, additional_kwargs=dict(HIDDEN), id="h1"),
        ai("Postgres it is.", id="a1"),
    ]


def test_should_keep_hidden_message_decides_about_hidden_user_turns(make, root):
    seen = []

    def keep(kwargs):
        seen.append(kwargs)
        return kwargs.get("marker") == "clarification"

    model = ScriptedModel()
    m = make(should_keep_hidden_message=keep, host_llm_factory=lambda: model)
    m.add("h", hidden_turn("I always choose Postgres for ledgers."), user_id="ann")
    assert m.shutdown_flush(30)
    assert seen and seen[0]["marker"] == "clarification"
    assert "I always choose Postgres" in prompt_text(model.calls[0][0])

    dropped = ScriptedModel()
    m2 = make(
        backend_config=config(root, max_facts=20),
        should_keep_hidden_message=lambda kwargs: False,
        host_llm_factory=lambda: dropped,
    )
    m2.add("h2", hidden_turn("I always choose Postgres for ledgers."), user_id="ann")
    assert m2.shutdown_flush(30)
    assert "I always choose Postgres" not in prompt_text(dropped.calls[0][0])


def test_a_raising_hidden_message_hook_is_logged_and_the_turn_goes_on(make, caplog):
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    model = ScriptedModel([update(fact("User reviews code on Fridays"))])
    m = make(should_keep_hidden_message=boom, host_llm_factory=lambda: model)
    m.add("h3", hidden_turn("ok") + turn("I review code on Fridays.", n=9), user_id="bea")
    assert m.shutdown_flush(30)
    (record,) = hook_warnings(caplog, "should_keep_hidden_message")
    assert record.exc_info and "hook exploded" in str(record.exc_info[1])
    assert [f["content"] for f in m.get_memory(user_id="bea")["facts"]] == [
        "User reviews code on Fridays"
    ]


@pytest.mark.parametrize("which", ["on_memory_llm_call", "on_memory_llm_result"])
def test_raising_model_callbacks_are_logged_and_extraction_goes_on(make, caplog, which):
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    callbacks = RecordingCallbacks()
    setattr(callbacks, which, boom)
    model = ScriptedModel([update(fact("User plays the cello"))])
    m = make(callbacks=callbacks, host_llm_factory=lambda: model)
    m.add("c", turn("I play the cello."), user_id="cy", trace_id="t-1")
    assert m.shutdown_flush(30)
    assert hook_warnings(caplog, which)
    assert [f["content"] for f in m.get_memory(user_id="cy")["facts"]] == ["User plays the cello"]


def test_raising_extraction_callback_and_trace_manager_are_logged(make, caplog):
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    model = ScriptedModel([update(fact("User grows tomatoes"))])
    m = make(
        extraction_callback=boom,
        trace_context_manager=boom,
        host_llm_factory=lambda: model,
    )
    m.add("x", turn("I grow tomatoes."), user_id="dee", trace_id="t-2")
    assert m.shutdown_flush(30)
    assert hook_warnings(caplog, "extraction_callback")
    assert hook_warnings(caplog, "trace_context_manager")
    assert [f["content"] for f in m.get_memory(user_id="dee")["facts"]] == ["User grows tomatoes"]


def test_a_raising_host_llm_factory_falls_back_to_the_offline_rules(make, caplog):
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    m = make(host_llm_factory=boom)
    assert any("host_llm_factory" in r.getMessage() for r in caplog.records)
    m.add("o", turn("I prefer tabs over spaces in every project."), user_id="eve")
    assert m.shutdown_flush(30)
    assert m.get_memory(user_id="eve")["facts"]


def test_a_failing_host_model_stores_nothing_and_the_turn_is_offered_again(make, caplog):
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    metrics = []
    callbacks = RecordingCallbacks()
    model = ScriptedModel([RuntimeError("model down"), update(fact("User studies Japanese"))])
    m = make(callbacks=callbacks, extraction_callback=metrics.append, host_llm_factory=lambda: model)
    convo = turn("I study Japanese every evening.")
    m.add("f", convo, user_id="fay")
    assert m.shutdown_flush(30)
    assert m.get_memory(user_id="fay")["facts"] == []
    assert metrics[-1]["success"] is False
    assert isinstance(callbacks.results[-1]["error"], RuntimeError)
    # The watermark did not advance: the same conversation is offered again.
    m.add("f", convo + turn("Any tips?", "Practice daily.", n=1), user_id="fay")
    assert m.shutdown_flush(30)
    assert [f["content"] for f in m.get_memory(user_id="fay")["facts"]] == ["User studies Japanese"]
    assert "every evening" in prompt_text(model.calls[1][0])


def test_a_configured_model_wins_over_the_host_factory(make, root):
    called = []
    m = make(
        backend_config=config(
            root, model={"model": "configured", "api_key": "sk-test", "base_url": "http://127.0.0.1:9"}
        ),
        host_llm_factory=lambda: called.append(1),
    )
    assert called == [], "the factory is only asked when backend_config names no model"
    assert m.backend_config["model"]["model"] == "configured"


def test_hooks_in_backend_config_win_over_the_keyword_hooks(make, root):
    from_config_key, from_kwarg = [], []
    model = ScriptedModel([update(fact("User knits scarves"))])
    cfg = config(root, extraction_callback=from_config_key.append, host_llm=model)
    m = make(backend_config=cfg, extraction_callback=from_kwarg.append)
    m.add("k", turn("I knit scarves."), user_id="gwen")
    assert m.shutdown_flush(30)
    assert len(from_config_key) == 1 and from_kwarg == []
    assert len(model.calls) == 1


def test_a_hook_may_call_back_into_the_manager(make):
    seen = []
    holder = {}

    def answer(prompt):
        # The host model runs on an engine thread too, and may use the manager.
        seen.append(holder["m"].get_context("hugo"))
        return update(fact("User sails on weekends"))

    model = ScriptedModel([answer])

    def on_metrics(payload):
        seen.append(holder["m"].get_memory(user_id="hugo")["facts"])

    m = make(extraction_callback=on_metrics, host_llm_factory=lambda: model)
    holder["m"] = m
    m.add("r", turn("I sail on weekends."), user_id="hugo")
    assert m.shutdown_flush(30)
    assert seen[0] == ""
    assert [f["content"] for f in seen[1]] == ["User sails on weekends"]


def test_unknown_host_hooks_are_ignored(make):
    m = make(summarization_hook=object())
    assert m.get_context("ivan") == ""


def test_engine_logs_reach_the_python_logger(make, caplog):
    caplog.set_level(logging.DEBUG, logger="deermem_rs")
    import deermem_rs._native as native

    native.refresh_log_level()
    m = make()
    m.add("log", [{"role": "user", "content": "hi"}], user_id="jan")
    assert any(
        r.name == "deermem_rs" and "nothing to remember" in r.getMessage() for r in caplog.records
    )
    caplog.set_level(logging.WARNING, logger="deermem_rs")
    native.refresh_log_level()
