"""Same data: a root written by the ``deermem`` CLI is read through the package and the other
way round, and a root the Python DeerMem wrote reads back with the facts it reported."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from conftest import REPO, config


def run_cli(cli: Path, root: Path, *args: str) -> str:
    out = subprocess.run(
        [str(cli), "--storage-path", str(root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"deermem {' '.join(args)} failed: {out.stderr}"
    return out.stdout


def test_a_root_written_by_the_cli_reads_through_the_package(make, root, cli):
    run_cli(
        cli, root, "facts", "add", "--user", "pia@example.com", "--content",
        "User deploys on Fridays", "--category", "decision", "--confidence", "0.8",
    )
    run_cli(
        cli, root, "facts", "add", "--user", "pia@example.com", "--agent", "Coder",
        "--content", "User writes Go at work",
    )
    m = make()
    (f,) = m.get_memory(user_id="pia@example.com")["facts"]
    assert (f["content"], f["category"], f["confidence"], f["source"]) == (
        "User deploys on Fridays", "decision", 0.8, "manual",
    )
    assert [h["content"] for h in m.search("Go", user_id="pia@example.com", agent_name="coder")] == [
        "User writes Go at work"
    ]
    assert "User deploys on Fridays" in m.get_context("pia@example.com")


def test_a_root_written_by_the_package_reads_through_the_cli(make, root, cli):
    m = make()
    _, fid = m.create_fact("User bakes bread", "preference", 0.7, user_id="quin")
    m.add("q", [
        {"role": "user", "content": "I prefer rye bread over white bread.", "id": "u0"},
        {"role": "assistant", "content": "Rye it is.", "id": "a0"},
    ], user_id="quin")
    assert m.shutdown_flush(30)
    ours = m.get_memory(user_id="quin")
    exported = json.loads(run_cli(cli, root, "--json", "export", "--user", "quin"))
    assert [f["id"] for f in exported["facts"]] == [f["id"] for f in ours["facts"]]
    assert exported["revision"] == ours["revision"]
    assert fid in {f["id"] for f in exported["facts"]}
    # An edit by the CLI is seen by the package after a reload.
    run_cli(cli, root, "facts", "update", fid, "--user", "quin", "--content", "User bakes sourdough")
    reloaded = m.reload_memory(user_id="quin")
    assert "User bakes sourdough" in {f["content"] for f in reloaded["facts"]}


def test_a_root_the_python_deermem_wrote_keeps_every_fact(make, tmp_path):
    source = REPO / "testdata" / "python-deermem"
    expected = json.loads((source / "expected.json").read_text())["v2"]
    root = tmp_path / "v2-root"
    shutil.copytree(source / "v2-root", root)
    m = make(backend_config=config(root))
    assert expected
    for scope, want in expected.items():
        user, agent = scope.split("|", 1)
        agent_name = None if agent == "__default__" else agent
        doc = m.get_memory(user_id=user, agent_name=agent_name)
        got = sorted((f["id"], f["content"]) for f in doc["facts"])
        assert got == sorted((f["id"], f["content"]) for f in want["facts"]), scope
