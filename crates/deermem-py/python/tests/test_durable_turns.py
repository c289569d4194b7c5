"""Durable turns inside the host process: a turn ``add()`` returned for is on disk before the
call returns, so a DeerFlow process killed (SIGKILL, no shutdown hook) before the debounce fired
loses nothing: the next process on the same storage root replays and applies it, once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import TESTS, config
from helpers import Answer, fact, prompt_text, update, wait_for

USERS = ("ann", "ben", "cy")
DRINKS = ("jasmine tea", "cold brew", "yerba mate", "matcha latte", "kombucha", "chai")

CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {stand_in!r})
    import deermem_rs

    class Down:
        model_name = "down-model"

        def invoke(self, prompt, config=None):
            raise ConnectionError("model endpoint unreachable")

    cfg = json.loads({cfg!r})
    m = deermem_rs.DeerMemManager.from_config(cfg, host_llm_factory=Down)
    for i, (user, drink) in enumerate(json.loads({turns!r})):
        m.add(
            f"thread-{{i}}",
            [
                {{"role": "user", "content": f"I prefer {{drink}} every afternoon.", "id": f"u{{i}}"}},
                {{"role": "assistant", "content": "Noted.", "id": f"a{{i}}"}},
            ],
            user_id=user,
        )
        print(f"added {{i}}", flush=True)
    print("all added", flush=True)
    time.sleep(600)
    """
)


class Extractor:
    """A working host model: proposes the drink the turn names as one durable fact."""

    model_name = "scripted-extractor"

    def __init__(self) -> None:
        self.calls = 0

    def invoke(self, prompt, config=None):
        self.calls += 1
        text = prompt_text(prompt)
        found = [d for d in DRINKS if re.search(rf"I prefer {d} every afternoon", text)]
        return Answer(json.dumps(update(*(fact(f"User prefers {d} in the afternoon") for d in found))))


def test_turns_added_before_a_sigkill_are_applied_by_the_next_process_once(make, root: Path):
    turns = [(USERS[i % len(USERS)], d) for i, d in enumerate(DRINKS)]
    # The first process: the model is down and the debounce is long, so nothing is extracted
    # before the kill; only the journal holds the turns.
    first_cfg = config(root, debounce_seconds=300)
    script = CHILD.format(
        stand_in=str(TESTS / "stand_in"), cfg=json.dumps(first_cfg), turns=json.dumps(turns)
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert child.stdout is not None
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.strip() == "all added":
                break
        assert lines and lines[-1] == "all added", (lines, child.stderr.read() if child.poll() is not None else "")
        # Every add() has returned: kill without any chance to flush.
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    journal = root / ".turns" / "journal.jsonl"
    assert journal.is_file(), "the accepted turns were not journaled under the storage root"
    # The journal holds the six turns (one `add` record each, nothing done): fsync'd before
    # each `add()` returned, so the kill could not lose them.
    records = [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]
    added = [r["item"] for r in records if r["op"] == "add"]
    assert len(added) == len(turns), records
    assert not [r for r in records if r["op"] == "done"], records

    # The next process: a working model and the shortest debounce; the replay queues the six
    # turns at start and each is applied once.
    model = Extractor()
    m = make(backend_config=config(root), host_llm_factory=lambda: model)

    def applied() -> bool:
        contents = [f["content"] for u in USERS for f in m.get_memory(user_id=u)["facts"]]
        return all(any(d in c for c in contents) for d in DRINKS)

    assert wait_for(applied, timeout=60), [m.get_memory(user_id=u)["facts"] for u in USERS]
    assert m.shutdown_flush(10) is True
    for user in USERS:
        contents = [f["content"] for f in m.get_memory(user_id=user)["facts"]]
        mine = [d for u, d in turns if u == user]
        assert sorted(contents) == sorted(f"User prefers {d} in the afternoon" for d in mine), contents
    # The replayed turns went through the working model (not the offline rules).
    assert model.calls >= 1


def test_a_second_host_process_on_the_root_accepts_turns_and_a_survivor_applies_them(make, root: Path):
    """DeerFlow's worker processes share one storage root: each journals its turns in a slot of
    its own (the first process's lock does not refuse the second's ``add``), and when one is
    killed the survivor takes its turns over at its next claim round and applies them once."""
    model = Extractor()
    # The survivor: this process, with a working model, holding the root's first journal slot.
    survivor = make(backend_config=config(root, debounce_seconds=1), host_llm_factory=lambda: model)
    survivor.add(
        "own-thread",
        [
            {"role": "user", "content": "I prefer chai every afternoon.", "id": "own-u"},
            {"role": "assistant", "content": "Noted.", "id": "own-a"},
        ],
        user_id="dan",
    )
    turns = [("eva", "jasmine tea"), ("eva", "cold brew"), ("fin", "yerba mate")]
    script = CHILD.format(
        stand_in=str(TESTS / "stand_in"),
        cfg=json.dumps(config(root, debounce_seconds=300)),
        turns=json.dumps(turns),
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        lines = []
        while True:
            line = child.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.strip() == "all added":
                break
        assert lines and lines[-1] == "all added", (lines, child.stderr.read())
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    # The killed process wrote a journal slot of its own beside the survivor's.
    slots = [p for p in (root / ".turns").rglob("journal.jsonl")]
    assert len(slots) == 2, slots

    def applied() -> bool:
        got = {
            u: [f["content"] for f in survivor.get_memory(user_id=u)["facts"]] for u in ("dan", "eva", "fin")
        }
        return all(
            any(d in c for c in got[u]) for u, d in [("dan", "chai"), *turns]
        )

    # The survivor's claim rounds run every 20 s.
    assert wait_for(applied, timeout=60), [survivor.get_memory(user_id=u)["facts"] for u in ("dan", "eva", "fin")]
    for user, mine in (("eva", ["jasmine tea", "cold brew"]), ("fin", ["yerba mate"])):
        contents = [f["content"] for f in survivor.get_memory(user_id=user)["facts"]]
        assert sorted(contents) == sorted(f"User prefers {d} in the afternoon" for d in mine), contents
