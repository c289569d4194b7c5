"""What the Python DeerMem accepts, the package accepts: long facts, imports longer than
``max_facts`` (streamed and trimmed, memory bounded by ``max_facts``), lenient import facts
(blank or missing ids, coerced confidences), and one engine per *resolved* configuration. Each
case goes through the stand-in router as well, so the status and detail DeerFlow would answer
are pinned; the hostile inputs of every manager method get the router's mapping too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
from conftest import config
from deerflow.host import (
    BAD_CONFIDENCE,
    CONFLICT,
    DUPLICATE,
    EMPTY_CONTENT,
    EVICTED,
    NEEDS_AGENT,
    UNHANDLED,
    route,
)


FACT_ID = re.compile(r"^fact_[0-9a-f]{8}$")


# -- long facts ---------------------------------------------------------------------------------


def test_a_long_fact_is_stored_as_the_python_deermem_stores_it(make):
    m = make()
    long = "x" * 20001
    status, (doc, fid) = route(lambda: m.create_fact(long, user_id="ann"), "create")
    assert status == 200 and FACT_ID.match(fid)
    assert doc["facts"][0]["content"] == long
    longer = "y" * 60000
    status, doc = route(lambda: m.update_fact(fid, content=longer, user_id="ann"), "update")
    assert status == 200 and doc["facts"][0]["content"] == longer
    # Injection skips a fact that cannot fit the budget instead of failing.
    m.create_fact("User prefers green tea", "preference", 0.4, user_id="ann")
    context = m.get_context("ann")
    assert "green tea" in context and longer not in context


# -- large imports ------------------------------------------------------------------------------


def test_an_import_longer_than_max_facts_keeps_max_facts_by_the_capacity_policy(make, root):
    m = make(backend_config=config(root, max_facts=20))
    facts = [
        {"id": f"fact_{i:05d}", "content": f"Imported fact {i}", "confidence": (i % 97) / 100}
        for i in range(2001)
    ]
    status, doc = route(lambda: m.import_memory({"facts": facts}, user_id="bo"), "import")
    assert status == 200
    assert len(doc["facts"]) == 20
    # The capacity policy keeps the most confident: the 20 facts at 0.96.
    assert {f["confidence"] for f in doc["facts"]} == {0.96}


def test_a_60000_fact_import_stays_under_200_mb_and_keeps_max_facts(root):
    """Measured in a child process of its own: its peak resident set (``ru_maxrss``) includes
    the caller's 60,000 dicts, the package and the engine."""
    script = textwrap.dedent(
        """
        import json, resource, sys
        import deermem_rs
        root = sys.argv[1]
        m = deermem_rs.DeerMemManager(
            backend_config={"storage_path": root, "token_counting": "char"}
        )
        facts = [{"id": f"fact_{i:06d}", "content": f"fact {i}"} for i in range(60000)]
        doc = m.import_memory({"facts": facts}, user_id="big")
        del facts
        m.shutdown_flush(10)
        m.close()
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"stored": len(doc["facts"]), "peak_mib": peak_kib / 1024}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["stored"] == 100, result  # the default max_facts
    assert result["peak_mib"] < 200, result


# -- lenient imports ----------------------------------------------------------------------------


def test_import_generates_blank_missing_and_none_ids_and_coerces_confidence(make):
    m = make()
    data = {
        "facts": [
            {"id": "", "content": "Blank id"},
            {"content": "No id key", "confidence": None},
            {"id": None, "content": "None id", "confidence": "0.9"},
            {"id": "fact_named01", "content": "Named", "confidence": "high"},
            {"id": "fact_named02", "content": "Too sure", "confidence": 7},
            {"id": "fact_named03", "content": "Not a number", "confidence": float("nan")},
        ]
    }
    status, doc = route(lambda: m.import_memory(data, user_id="cy"), "import")
    assert status == 200
    by_content = {f["content"]: f for f in doc["facts"]}
    assert set(by_content) == {f["content"] for f in data["facts"]}
    for content in ("Blank id", "No id key", "None id"):
        assert FACT_ID.match(by_content[content]["id"]), by_content[content]
    assert len({f["id"] for f in doc["facts"]}) == 6
    assert by_content["Named"]["id"] == "fact_named01"
    assert by_content["No id key"]["confidence"] == 0.5
    assert by_content["None id"]["confidence"] == 0.9
    assert by_content["Named"]["confidence"] == 0.5
    assert by_content["Too sure"]["confidence"] == 1.0
    assert by_content["Not a number"]["confidence"] == 0.5
    # What was generated is stored: the next export names the same ids.
    assert {f["id"] for f in m.export_memory(user_id="cy")["facts"]} == {
        f["id"] for f in doc["facts"]
    }


# -- one engine per resolved configuration ------------------------------------------------------


def test_managers_without_a_root_follow_deermem_data_dir_when_it_changes(make, tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("DEERMEM_DATA_DIR", str(first))
    a = make(backend_config={"token_counting": "char"})
    monkeypatch.setenv("DEERMEM_DATA_DIR", str(second))
    b = make(backend_config={"token_counting": "char"})
    assert a._engine.key != b._engine.key
    a.create_fact("Fact in the first root", user_id="dee")
    b.create_fact("Fact in the second root", user_id="dee")
    assert [f["content"] for f in a.get_memory(user_id="dee")["facts"]] == ["Fact in the first root"]
    assert [f["content"] for f in b.get_memory(user_id="dee")["facts"]] == ["Fact in the second root"]
    assert list((first / "users").glob("dee/agents/__default__/facts/*/*.md"))
    assert list((second / "users").glob("dee/agents/__default__/facts/*/*.md"))


def test_a_relative_storage_path_is_resolved_when_the_manager_is_built(make, tmp_path, monkeypatch):
    monkeypatch.delenv("DEER_FLOW_HOME", raising=False)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    a = make(backend_config={"storage_path": "mem", "token_counting": "char"})
    monkeypatch.chdir(tmp_path / "two")
    b = make(backend_config={"storage_path": "mem", "token_counting": "char"})
    assert a._engine.key != b._engine.key
    a.create_fact("Written from one", user_id="eve")
    b.create_fact("Written from two", user_id="eve")
    # A manager keeps its root after a chdir, and the two never share one.
    a.close()
    assert [f["content"] for f in a.get_memory(user_id="eve")["facts"]] == ["Written from one"]
    assert list((tmp_path / "one" / "mem" / "users").glob("eve/agents/*/facts/*/*.md"))
    assert list((tmp_path / "two" / "mem" / "users").glob("eve/agents/*/facts/*/*.md"))
    # The same root spelt two ways is one engine.
    c = make(backend_config={"storage_path": str(tmp_path / "two" / "mem"), "token_counting": "char"})
    assert c._engine.key == b._engine.key


# -- the router's mapping, method by method -----------------------------------------------------


def test_fact_routes_map_every_refusal_as_deerflows_router_does(make, root):
    m = make(backend_config=config(root, max_facts=10))
    user = "fay"
    status, (doc, fid) = route(lambda: m.create_fact("User sails", "context", 0.9, user_id=user), "create")
    assert status == 200
    assert route(lambda: m.create_fact("user SAILS ", user_id=user), "create") == (409, DUPLICATE)
    assert route(lambda: m.create_fact("x", confidence=3.0, user_id=user), "create") == (400, BAD_CONFIDENCE)
    assert route(lambda: m.create_fact("x", confidence=float("nan"), user_id=user), "create") == (
        400,
        BAD_CONFIDENCE,
    )
    assert route(lambda: m.create_fact(" \t", user_id=user), "create") == (400, EMPTY_CONTENT)
    for agent in ("../x", "a_b", "x" * 200):
        assert route(lambda: m.create_fact("x", user_id=user, agent_name=agent), "create") == (
            400,
            NEEDS_AGENT,
        ), agent
        assert route(lambda: m.update_fact(fid, content="y", user_id=user, agent_name=agent), "update") == (
            400,
            NEEDS_AGENT,
        ), agent
    # A long category is stored, as the Python DeerMem stores it.
    status, _ = route(lambda: m.create_fact("User rows", "c" * 500, 0.95, user_id=user), "create")
    assert status == 200
    # The bucket is full of confident facts (max_facts is at least 10): a weak one is evicted
    # at once, nothing stored.
    for i in range(8):
        status, _ = route(lambda: m.create_fact(f"User owns boat number {i}", "context", 0.95, user_id=user), "create")
        assert status == 200
    assert len(m.get_memory(user_id=user)["facts"]) == 10
    assert route(lambda: m.create_fact("Weak", "context", 0.01, user_id=user), "create") == (409, EVICTED)
    assert len(m.get_memory(user_id=user)["facts"]) == 10

    assert route(lambda: m.update_fact("fact_missing", content="y", user_id=user), "update") == (
        404,
        "Memory fact 'fact_missing' not found.",
    )
    assert route(lambda: m.update_fact(fid, confidence=-1, user_id=user), "update") == (400, BAD_CONFIDENCE)
    assert route(lambda: m.update_fact(fid, content="  ", user_id=user), "update") == (400, EMPTY_CONTENT)
    # A fact id with characters ids cannot hold: the router's reading of an unknown code, as
    # the reference answers a PATCH of such an id.
    assert route(lambda: m.update_fact("../etc", content="y", user_id=user), "update") == (400, EMPTY_CONTENT)

    assert route(lambda: m.delete_fact("fact_missing", user_id=user), "delete") == (
        404,
        "Memory fact 'fact_missing' not found.",
    )
    # The delete route catches no ValueError: Starlette's plain 500, as with the reference.
    assert route(lambda: m.delete_fact("../etc", user_id=user), "delete") == (500, UNHANDLED)
    status, doc = route(lambda: m.delete_fact(fid, user_id=user), "delete")
    assert status == 200 and fid not in {f["id"] for f in doc["facts"]}


def test_document_routes_map_every_refusal_as_deerflows_router_does(make):
    m = make()
    user = "gil"
    m.create_fact("User knits", user_id=user)
    for op, call in [
        ("get", lambda a: m.get_memory(user_id=user, agent_name=a)),
        ("get", lambda a: m.export_memory(user_id=user, agent_name=a)),
        ("reload", lambda a: m.reload_memory(user_id=user, agent_name=a)),
        ("clear", lambda a: m.clear_memory(user_id=user, agent_name=a)),
        ("import", lambda a: m.import_memory({}, user_id=user, agent_name=a)),
    ]:
        # Unknown codes escape these routes.
        assert route(lambda: call("../x"), op) == (500, UNHANDLED), op
    for hostile in ("not a document", {"user": "nope"}, {"facts": {"a": 1}}, {"facts": ["x"]}):
        assert route(lambda: m.import_memory(hostile, user_id=user), "import") == (500, UNHANDLED)
    dup = {"facts": [{"id": "fact_a", "content": "one"}, {"id": "fact_a", "content": "two"}]}
    with pytest.raises(ValueError) as e:
        m.import_memory(dup, user_id=user)
    assert e.value.args == ("memory_data.facts",)
    old = m.export_memory(user_id=user)
    m.update_fact(old["facts"][0]["id"], content="User knits scarves", user_id=user)
    assert route(lambda: m.import_memory(old, user_id=user), "import") == (409, CONFLICT)
    assert route(lambda: m.get_context(user, agent_name="../x")) == (500, UNHANDLED)
    assert route(lambda: m.search("knits", user_id=user, agent_name="../x")) == (500, UNHANDLED)
    with pytest.raises(ValueError) as e:
        m.search("knits", user_id=user, agent_name="../x")
    assert e.value.args == ("agent_name",) and "Invalid agent name" in e.value.detail
    status, cleared = route(lambda: m.clear_memory(user_id=user), "clear")
    assert status == 200 and cleared["facts"] == []


def test_a_failed_write_is_the_write_routes_500(make, tmp_path):
    # `users` is a file, so no user directory can be made: every write fails with an OSError.
    root = tmp_path / "broken-root"
    root.mkdir()
    (root / "users").write_text("not a directory")
    m = make(backend_config=config(root))
    user = "hud"
    assert route(lambda: m.create_fact("User hikes", user_id=user), "create") == (
        500,
        "Failed to create memory fact.",
    )
    assert route(lambda: m.import_memory({"facts": [{"content": "x"}]}, user_id=user), "import") == (
        500,
        "Failed to import memory data.",
    )
    with pytest.raises(OSError):
        m.create_fact("User hikes", user_id=user)


def test_the_memory_add_tool_gets_a_document_for_a_long_fact(make):
    """DeerFlow's ``memory_add`` tool returns the manager's answer, or ``{"error": str(e)}``."""
    m = make(mode="tool")

    def memory_add(content: str) -> dict:
        try:
            doc, fid = m.create_fact(content, user_id="ivo")
        except ValueError as e:
            return {"error": str(e)}
        return {"id": fid, "facts": len(doc["facts"])}

    assert memory_add("z" * 20001)["facts"] == 1
    assert memory_add("   ") == {"error": "content"}
