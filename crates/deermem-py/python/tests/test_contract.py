"""Every method of the memory-manager contract through the package, with good and bad input,
and the return shapes of the Python DeerMem (the public camelCase document)."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest
from conftest import config
from deerflow.agents.memory import (
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
)
from deerflow.host import route
from helpers import turn, wait_for

import deermem_rs

SUMMARY_KEYS = {"summary", "updatedAt"}
FACT_ID = re.compile(r"^fact_[0-9a-f]{8}$")


def assert_document(doc: dict) -> None:
    """The public document shape the router and the frontend read."""
    assert set(doc) >= {"version", "lastUpdated", "user", "history", "facts"}
    assert doc["version"] in ("1.0", "2.0")
    assert set(doc["user"]) == {"workContext", "personalContext", "topOfMind"}
    assert set(doc["history"]) == {"recentMonths", "earlierContext", "longTermBackground"}
    for section in (*doc["user"].values(), *doc["history"].values()):
        assert set(section) == SUMMARY_KEYS
    for f in doc["facts"]:
        assert isinstance(f["id"], str) and isinstance(f["content"], str)
        assert isinstance(f["source"], str)
        assert 0.0 <= f["confidence"] <= 1.0


# -- construction ------------------------------------------------------------------------------


def test_from_config_builds_a_host_memory_manager_that_passes_the_invariant_check(make, root):
    m = make()
    assert isinstance(m, MemoryManager)
    assert type(m).supports_search is True
    assert type(m).requires_passive_writes_in_tool_mode is False
    assert m.backend_config == config(root)
    assert m.mode == "middleware"
    tool = make(mode="tool")
    assert tool.mode == "tool"


def test_direct_construction_also_builds_the_engine(root):
    m = deermem_rs.DeerMemManager(backend_config=config(root))
    try:
        m.create_fact("User drinks green tea", user_id="u1")
        assert (root / "users" / "u1" / "memory.json").is_file()
    finally:
        m.close()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"max_facts": 5}, "max_facts"),
        ({"token_counting": "words"}, "token_counting"),
        ({"debounce_seconds": "soon"}, "debounce_seconds"),
    ],
)
def test_invalid_backend_config_is_a_value_error_naming_the_key(make, root, extra, key):
    with pytest.raises(ValueError, match=key):
        make(backend_config=config(root, **extra))


def test_paths_may_be_path_objects(make, root):
    m = make(backend_config={"storage_path": root, "token_counting": "char"})
    m.create_fact("User keeps paths as objects", user_id="pam")
    assert (root / "users" / "pam" / "memory.json").is_file()


def test_storage_path_that_is_a_file_is_refused(make, tmp_path):
    f = tmp_path / "memory.json"
    f.write_text("{}")
    with pytest.raises(ValueError, match="storage_path"):
        make(backend_config={"storage_path": str(f)})


def test_unusable_mode_and_config_types_are_refused(make, root):
    with pytest.raises(ValueError):
        make(mode="sometimes")
    with pytest.raises((TypeError, ValueError)):
        make(backend_config={"storage_path": str(root), "max_facts": object()})


def test_managers_of_one_configuration_share_one_engine(make, root):
    a = make()
    b = make()
    assert a._engine.key == b._engine.key
    a.create_fact("User works on payments", user_id="u1")
    # The second manager sees the first one's write through the same cache and index.
    assert [f["content"] for f in b.search("payments", user_id="u1")] == ["User works on payments"]
    a.close()
    assert b.get_memory(user_id="u1")["facts"][0]["content"] == "User works on payments"
    other = make(backend_config=config(root, max_facts=50))
    assert other._engine.key != a._engine.key


# -- add / add_nowait ------------------------------------------------------------------------


def test_add_queues_a_turn_that_the_flush_extracts(make):
    m = make()
    m.add(
        "thread-1",
        turn("I prefer Rust for backend services and I work as a data engineer."),
        user_id="alice",
        trace_id="trace-1",
    )
    assert m.shutdown_flush(10) is True
    facts = m.get_memory(user_id="alice")["facts"]
    assert facts, "the offline rules extracted the stated preference"
    assert all(f["source"] == "thread-1" for f in facts)


def test_add_nowait_is_processed_without_waiting_for_the_debounce(make, root):
    m = make(backend_config=config(root, debounce_seconds=300))
    m.add_nowait("thread-2", turn("I prefer dark roast coffee every morning."), user_id="bob")
    assert wait_for(lambda: m.get_memory(user_id="bob")["facts"]), "the emergency item ran at once"


def test_a_turn_beyond_the_pending_byte_limit_raises_instead_of_returning_unkept(make, root):
    from deermem_rs import MemoryManagerError

    m = make(
        backend_config=config(root, debounce_seconds=300, queue_max_pending_bytes_per_user=8192)
    )
    m.add("small", turn("I prefer green tea."), user_id="carl")
    # Larger than the user's limit: it can never be queued. `add` offers it again for a few
    # seconds, then raises: returning would tell the host a turn was kept that was not (the
    # reference drops it silently).
    big = turn("I prefer oolong. " + "tea " * 4096)
    started = time.monotonic()
    with pytest.raises(MemoryManagerError, match="not kept"):
        m.add("big", big, user_id="carl")
    assert time.monotonic() - started >= 4.5, "offered again before giving up"
    with pytest.raises(MemoryManagerError, match="not kept"):
        m.add_nowait("big-now", big, user_id="carl")
    # A turn that fits is still accepted once the pending bytes drained.
    assert m.shutdown_flush(10) is True
    contents = [f["content"] for f in m.get_memory(user_id="carl")["facts"]]
    assert not any("oolong" in c.lower() for c in contents), contents
    assert any("green tea" in c.lower() for c in contents), contents


def test_a_turn_refused_while_the_users_bytes_are_pending_is_kept_once_they_drain(make, root):
    m = make(
        backend_config=config(root, debounce_seconds=1, queue_max_pending_bytes_per_user=12000)
    )
    first = turn("I prefer oolong tea. " + "tea " * 2000)
    m.add("first", first, user_id="dora")
    # Together with the first turn this exceeds the user's limit until the first is processed
    # (after the one-second debounce): `add` waits for room and returns once the turn is kept.
    second = turn("I prefer cycling to work. " + "bike " * 1600)
    m.add("second", second, user_id="dora")
    assert m.shutdown_flush(20) is True
    contents = " ".join(f["content"].lower() for f in m.get_memory(user_id="dora")["facts"])
    assert "oolong" in contents and "cycling" in contents, contents


def test_add_rejects_bad_arguments_and_skips_unreadable_messages(make):
    m = make()
    with pytest.raises(TypeError):
        m.add(42, turn("hello"), user_id="alice")
    with pytest.raises(TypeError):
        m.add("t", "I prefer tea", user_id="alice")
    with pytest.raises(TypeError):
        m.add("t", 7, user_id="alice")
    with pytest.raises(ValueError, match="user_id"):
        m.add("t", turn("I prefer tea"), user_id="")
    with pytest.raises(ValueError, match="gent name"):
        m.add("t", turn("I prefer tea"), user_id="alice", agent_name="no spaces allowed")
    with pytest.raises(ValueError, match="thread_id"):
        m.add("t\0", turn("I prefer tea"), user_id="alice")
    # A message without a type or role is skipped; the rest of the turn still counts.
    m.add("t", [{"content": "no role"}, *turn("I prefer oolong tea over coffee.")], user_id="alice")
    assert m.shutdown_flush(10)
    assert m.get_memory(user_id="alice")["facts"]


def test_add_reads_content_blocks_and_drops_tool_calling_turns(make):
    m = make()
    messages = [
        {"type": "human", "content": [{"type": "text", "text": "I prefer Vim keybindings"}, " in every editor."]},
        {"type": "ai", "content": "", "tool_calls": [{"name": "search", "args": {}, "id": "c1"}]},
        {"type": "tool", "content": "results", "tool_call_id": "c1"},
        {"type": "ai", "content": "Vim keybindings it is."},
    ]
    m.add("blocks", messages, user_id="carol")
    assert m.shutdown_flush(10)
    contents = [f["content"] for f in m.get_memory(user_id="carol")["facts"]]
    assert any("Vim keybindings" in c for c in contents), contents


# -- get_context -------------------------------------------------------------------------------


def test_get_context_holds_the_facts_in_middleware_mode_and_summaries_only_in_tool_mode(make, root):
    m = make()
    assert m.get_context("dave") == ""
    m.create_fact("User is allergic to peanuts", "identity", 0.95, user_id="dave")
    assert "User is allergic to peanuts" in m.get_context("dave")
    assert "peanuts" not in m.get_context("dave", agent_name="other-agent")
    tool = make(mode="tool")
    assert "peanuts" not in tool.get_context("dave")


def test_get_context_rejects_bad_scopes(make):
    m = make()
    with pytest.raises(ValueError):
        m.get_context("")
    with pytest.raises(ValueError):
        m.get_context("alice", agent_name="bad/agent")
    with pytest.raises(TypeError):
        m.get_context(123)


# -- search ------------------------------------------------------------------------------------


def test_search_ranks_filters_and_cuts(make):
    m = make()
    for text, cat in [
        ("User prefers Rust for systems work", "preference"),
        ("User is learning Rust macros", "goal"),
        ("User lives in Lisbon", "identity"),
    ]:
        m.create_fact(text, cat, 0.9, user_id="erin")
    hits = m.search("Rust", user_id="erin")
    assert {h["content"] for h in hits} == {
        "User prefers Rust for systems work",
        "User is learning Rust macros",
    }
    assert all(set(h) >= {"id", "content", "category", "confidence", "source"} for h in hits)
    assert [h["category"] for h in m.search("Rust", user_id="erin", category="goal")] == ["goal"]
    assert len(m.search("Rust", 1, user_id="erin")) == 1
    assert m.search("Rust", 0, user_id="erin") == []
    assert m.search("Rust", -3, user_id="erin") == []
    assert m.search("   ", user_id="erin") == []
    assert m.search("Rust", user_id="someone-else") == []


def test_search_rejects_bad_arguments(make):
    m = make()
    with pytest.raises(TypeError):
        m.search(None, user_id="erin")
    with pytest.raises(TypeError):
        m.search("Rust", "five", user_id="erin")
    with pytest.raises(TypeError):
        m.search("Rust", True, user_id="erin")
    with pytest.raises(ValueError):
        m.search("Rust", user_id="erin", agent_name="Not Valid")


def test_search_mode_ranks_by_words_and_refuses_vector_modes_without_an_embedder(make):
    m = make()
    m.create_fact("Prefers oolong tea", "preference", 0.9, user_id="erin")
    for mode in (None, "bm25", "BM25"):
        hits = m.search("oolong", user_id="erin", mode=mode)
        assert [h["content"] for h in hits] == ["Prefers oolong tea"], mode
    for mode in ("vector", "hybrid"):
        with pytest.raises(ValueError) as err:
            m.search("oolong", user_id="erin", mode=mode)
        wanted = f"search mode {mode} needs an embedder: set backend_config.embedding"
        assert str(err.value) == wanted
    with pytest.raises(ValueError) as err:
        m.search("oolong", user_id="erin", mode="semantic")
    assert "is not a search mode; use bm25, vector or hybrid" in str(err.value)
    with pytest.raises(TypeError):
        m.search("oolong", user_id="erin", mode=1)


# -- documents ---------------------------------------------------------------------------------


def test_get_memory_returns_the_public_document(make):
    m = make()
    empty = m.get_memory(user_id="fresh")
    assert_document(empty)
    assert empty["version"] == "1.0" and empty["revision"] == 0 and empty["facts"] == []
    doc, fid = m.create_fact("User likes tea", "preference", 0.8, user_id="fresh")
    assert_document(doc)
    assert doc["version"] == "2.0" and doc["revision"] == 1
    (f,) = doc["facts"]
    assert f["id"] == fid and f["source"] == "manual" and f["category"] == "preference"
    assert f["scope"] == {"userId": "fresh", "agentName": "__default__"}
    assert m.export_memory(user_id="fresh") == m.get_memory(user_id="fresh")
    json.dumps(doc)  # plain JSON types only


def test_clear_memory_without_an_agent_clears_everything_and_with_one_only_its_facts(make):
    m = make()
    m.create_fact("Default bucket fact", user_id="gus")
    m.create_fact("Coder bucket fact", user_id="gus", agent_name="coder")
    m.create_fact("Writer bucket fact", user_id="gus", agent_name="Writer")
    cleared = m.clear_memory(user_id="gus", agent_name="coder")
    assert cleared["facts"] == []
    assert [f["content"] for f in m.get_memory(user_id="gus", agent_name="writer")["facts"]] == [
        "Writer bucket fact"
    ]
    everything = m.clear_memory(user_id="gus")
    assert_document(everything)
    assert m.get_memory(user_id="gus")["facts"] == []
    assert m.get_memory(user_id="gus", agent_name="writer")["facts"] == []


def test_import_replaces_the_bucket_and_round_trips_an_export(make):
    m = make()
    m.create_fact("Old fact one", user_id="hal")
    m.create_fact("Old fact two", user_id="hal")
    exported = m.export_memory(user_id="hal")
    incoming = {
        "version": "1.0",
        "user": {"workContext": {"summary": "Works on billing", "updatedAt": ""}},
        "facts": [
            exported["facts"][0],
            {"id": "fact_new00001", "content": "Imported fact", "category": "workflow"},
        ],
    }
    doc = m.import_memory(incoming, user_id="hal")
    assert_document(doc)
    assert {f["content"] for f in doc["facts"]} == {exported["facts"][0]["content"], "Imported fact"}
    imported = next(f for f in doc["facts"] if f["id"] == "fact_new00001")
    assert imported["category"] == "other" and imported["categoryExtension"] == "workflow"
    assert doc["user"]["workContext"]["summary"] == "Works on billing"
    again = m.import_memory(m.export_memory(user_id="hal"), user_id="hal")
    assert [f["id"] for f in again["facts"]] == [f["id"] for f in doc["facts"]]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        ("not a document", "memory_data"),
        ({"user": "nope"}, "memory_data.user"),
        ({"history": []}, "memory_data.history"),
        ({"facts": {"a": 1}}, "memory_data.facts"),
        ({"facts": [{"id": "bad id!", "content": "x"}]}, "memory_data.facts"),
        ({"facts": [{"id": "fact_a", "content": "x", "createdAt": object()}]}, "memory_data.facts"),
    ],
)
def test_import_rejects_malformed_documents_with_the_reference_codes(make, data, code):
    m = make()
    with pytest.raises(ValueError) as e:
        m.import_memory(data, user_id="hal")
    assert e.value.args[0] == code


def test_importing_an_old_export_after_an_edit_is_a_conflict(make):
    m = make()
    _, fid = m.create_fact("Fact to edit", user_id="ivy")
    old = m.export_memory(user_id="ivy")
    m.update_fact(fid, content="Fact edited", user_id="ivy")
    with pytest.raises(MemoryConflictError):
        m.import_memory(old, user_id="ivy")
    assert route(lambda: m.import_memory(old, user_id="ivy"), "import")[0] == 409


def test_delete_memory_is_not_supported(make):
    m = make()
    with pytest.raises(NotImplementedError, match="delete_memory not supported by DeerMemManager"):
        m.delete_memory(user_id="ivy")


def test_reload_memory_picks_up_out_of_band_edits(make, root):
    m = make()
    _, fid = m.create_fact("Fact removed behind our back", user_id="jo")
    assert m.get_memory(user_id="jo")["facts"]
    (path,) = list((root / "users" / "jo").rglob(f"{fid}.md"))
    path.unlink()
    assert m.reload_memory(user_id="jo")["facts"] == []
    assert m.search("removed", user_id="jo") == []


def test_corrupt_memory_is_a_corruption_error(make, root):
    m = make()
    m.create_fact("A fact", user_id="kim")
    manifest = root / "users" / "kim" / "memory.json"
    manifest.write_text("{ this is not json")
    with pytest.raises(MemoryCorruptionError):
        m.reload_memory(user_id="kim")
    assert route(lambda: m.reload_memory(user_id="kim"), "reload") == (500, "Stored memory data is corrupted.")


# -- fact CRUD ---------------------------------------------------------------------------------


def test_create_fact_returns_the_document_and_the_new_id(make):
    m = make()
    doc, fid = m.create_fact("  User runs marathons  ", "", 1.0, user_id="lee")
    assert FACT_ID.match(fid)
    (f,) = doc["facts"]
    assert f["content"] == "User runs marathons" and f["category"] == "context"
    assert f["confidence"] == 1.0


@pytest.mark.parametrize(
    ("args", "kwargs", "code", "status"),
    [
        (("   ",), {}, "content", 400),
        (("x", "context", 1.5), {}, "confidence", 400),
        (("x", "context", -0.1), {}, "confidence", 400),
        (("x", "context", math.nan), {}, "confidence", 400),
        (("x", "context", math.inf), {}, "confidence", 400),
    ],
)
def test_create_fact_rejects_invalid_input_with_the_router_codes(make, args, kwargs, code, status):
    m = make()
    with pytest.raises(ValueError) as e:
        m.create_fact(*args, user_id="lee", **kwargs)
    assert str(e.value) == code
    assert route(lambda: m.create_fact(*args, user_id="lee", **kwargs), "create")[0] == status


def test_create_fact_duplicates_and_types(make):
    m = make()
    m.create_fact("User likes jazz", user_id="lee")
    with pytest.raises(ValueError) as e:
        m.create_fact("  user LIKES jazz ", user_id="lee")
    assert e.value.args == ("Duplicate fact",)
    assert route(lambda: m.create_fact("User likes jazz", user_id="lee"), "create")[0] == 409
    with pytest.raises(TypeError):
        m.create_fact(None, user_id="lee")
    with pytest.raises(TypeError):
        m.create_fact("x", 3, user_id="lee")
    with pytest.raises(TypeError):
        m.create_fact("x", "context", "high", user_id="lee")


def test_create_fact_evicted_by_capacity_returns_no_id_and_stores_nothing(make, root):
    m = make(backend_config=config(root, max_facts=10))
    for i in range(10):
        m.create_fact(f"Strong fact number {i}", "context", 0.95, user_id="max")
    doc, fid = m.create_fact("Weak fact", "context", 0.05, user_id="max")
    assert fid is None
    assert len(doc["facts"]) == 10
    assert "Weak fact" not in {f["content"] for f in m.get_memory(user_id="max")["facts"]}


def test_update_fact_changes_only_the_given_fields(make):
    m = make()
    _, fid = m.create_fact("User drives a bike", "context", 0.6, user_id="ned")
    doc = m.update_fact(fid, content="User rides a bike", user_id="ned")
    (f,) = doc["facts"]
    assert f["content"] == "User rides a bike" and f["confidence"] == 0.6 and f["revision"] == 2
    doc = m.update_fact(fid, confidence=0.9, category="", user_id="ned")
    (f,) = doc["facts"]
    assert f["confidence"] == 0.9 and f["category"] == "context"
    unchanged = m.update_fact(fid, user_id="ned")
    assert unchanged["facts"][0]["revision"] == f["revision"]


def test_update_and_delete_fact_errors(make):
    m = make()
    _, fid = m.create_fact("User owns a cat", user_id="oz")
    with pytest.raises(KeyError) as e:
        m.update_fact("fact_missing1", content="x", user_id="oz")
    assert e.value.args == ("fact_missing1",)
    assert route(lambda: m.update_fact("fact_missing1", content="x", user_id="oz"), "update")[0] == 404
    with pytest.raises(ValueError) as e:
        m.update_fact(fid, content="   ", user_id="oz")
    assert str(e.value) == "content"
    with pytest.raises(ValueError) as e:
        m.update_fact(fid, confidence=7, user_id="oz")
    assert str(e.value) == "confidence"
    with pytest.raises(ValueError):
        m.update_fact("../escape", content="x", user_id="oz")
    with pytest.raises(TypeError):
        m.update_fact(fid, content=5, user_id="oz")
    with pytest.raises(KeyError):
        m.delete_fact("fact_missing1", user_id="oz")
    with pytest.raises(KeyError):
        m.delete_fact(fid, user_id="someone-else")
    with pytest.raises(ValueError):
        m.delete_fact("a/b", user_id="oz")
    with pytest.raises(TypeError):
        m.delete_fact(None, user_id="oz")


def test_delete_fact_removes_it(make):
    m = make()
    _, keep = m.create_fact("Fact kept", user_id="pat")
    _, gone = m.create_fact("Fact deleted", user_id="pat")
    doc = m.delete_fact(gone, user_id="pat")
    assert [f["id"] for f in doc["facts"]] == [keep]
    assert m.search("deleted", user_id="pat") == []


# -- lifecycle ---------------------------------------------------------------------------------


def test_flush_warm_close_and_the_no_op_hooks(make, root):
    m = make()
    assert m.shutdown_flush(0) is True, "an idle queue drains at once"
    with pytest.raises(ValueError):
        m.shutdown_flush(math.nan)
    with pytest.raises((TypeError, ValueError)):
        m.shutdown_flush("soon")
    assert m.warm() is True
    tik = make(backend_config=config(root, token_counting="tiktoken"))
    assert tik.warm() is True
    m.create_fact("Indexed fact", user_id="quinn")
    assert m.warm_retrieval() is True
    assert m.on_pre_compress([]) == ""
    assert m.on_turn_start(1, None) is None
    m.close()
    m.close()
    # A closed manager attaches again on its next call.
    assert m.get_memory(user_id="quinn")["facts"][0]["content"] == "Indexed fact"


def test_user_ids_are_stored_under_the_reference_bucket_names(make, root):
    m = make()
    m.create_fact("Fact of a hashed id", user_id="a@b.com")
    assert (root / "users" / "a-b-com-fb98d44ad7501a95" / "memory.json").is_file()
    (f,) = m.get_memory(user_id="a@b.com")["facts"]
    assert f["scope"]["userId"] == "a@b.com"


def test_files_are_written_in_the_reference_layout(make, root):
    m = make()
    _, fid = m.create_fact("Layout fact", user_id="rae", agent_name="Coder")
    facts = list((root / "users" / "rae" / "agents" / "coder" / "facts").rglob("*.md"))
    assert [p.name for p in facts] == [f"{fid}.md"]
    assert Path(root / "users" / "rae" / "memory.json").is_file()


SCOPED = [
    ("get_context", lambda m, **kw: m.get_context(kw.pop("user_id"), **kw)),
    ("search", lambda m, **kw: m.search("x", **kw)),
    ("get_memory", lambda m, **kw: m.get_memory(**kw)),
    ("export_memory", lambda m, **kw: m.export_memory(**kw)),
    ("reload_memory", lambda m, **kw: m.reload_memory(**kw)),
    ("clear_memory", lambda m, **kw: m.clear_memory(**kw)),
    ("import_memory", lambda m, **kw: m.import_memory({}, **kw)),
    ("create_fact", lambda m, **kw: m.create_fact("x", **kw)),
    ("update_fact", lambda m, **kw: m.update_fact("fact_00000000", content="x", **kw)),
    ("delete_fact", lambda m, **kw: m.delete_fact("fact_00000000", **kw)),
    ("add", lambda m, **kw: m.add("t", turn("x"), **kw)),
    ("add_nowait", lambda m, **kw: m.add_nowait("t", turn("x"), **kw)),
]


@pytest.mark.parametrize(("name", "call"), SCOPED, ids=[n for n, _ in SCOPED])
def test_every_scoped_method_refuses_bad_user_ids_and_agent_names(make, name, call):
    m = make()
    with pytest.raises(ValueError, match="user_id"):
        call(m, user_id="")
    with pytest.raises(ValueError, match="gent name"):
        call(m, user_id="ok", agent_name="no/slashes")
    with pytest.raises(ValueError, match="gent name"):
        call(m, user_id="ok", agent_name="")
    with pytest.raises(TypeError):
        call(m, user_id=["not", "a", "string"])


def test_async_methods_raise_the_same_errors(make):
    import asyncio

    m = make()

    async def main():
        with pytest.raises(ValueError):
            await m.aget_context("")
        with pytest.raises(TypeError):
            await m.asearch(None, user_id="ok")
        with pytest.raises(TypeError):
            await m.aadd("t", "not a list", user_id="ok")
        return await m.asearch("x", 0, user_id="ok")

    assert asyncio.run(main()) == []
