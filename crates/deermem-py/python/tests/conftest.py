"""Shared fixtures of the deermem_rs suite. The suite runs as DeerFlow would load the package:
the stand-in DeerFlow host (``stand_in/deerflow``) is importable, so ``DeerMemManager`` is a
subclass of its ``MemoryManager``. ``test_plain.py`` checks the package without it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "stand_in"))

import deermem_rs  # noqa: E402
from deerflow.agents.memory import reset_memory_manager  # noqa: E402

REPO = TESTS.parents[3]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A fresh storage root."""
    return tmp_path / "memory-root"


def config(root: Path, **extra):
    """A DeerMem ``backend_config`` for a test root (character token counting, the shortest
    debounce)."""
    cfg = {"storage_path": str(root), "token_counting": "char", "debounce_seconds": 1}
    cfg.update(extra)
    return cfg


@pytest.fixture
def make(root: Path):
    """Builds managers with ``from_config`` and flushes and closes them after the test."""
    made = []

    def build(mode: str = "middleware", backend_config=None, **hooks):
        cfg = backend_config if backend_config is not None else config(root)
        m = deermem_rs.DeerMemManager.from_config(cfg, mode=mode, **hooks)
        made.append(m)
        return m

    yield build
    for m in made:
        m.shutdown_flush(10)
        m.close()
    reset_memory_manager()


@pytest.fixture
def cli() -> Path:
    """The ``deermem`` binary (``$DEERMEM_CLI``, else the workspace's debug build)."""
    path = Path(os.environ.get("DEERMEM_CLI") or REPO / "target" / "debug" / "deermem")
    assert path.is_file(), (
        f"the deermem CLI is needed at {path}: run `cargo build -p deermem-cli` or set DEERMEM_CLI"
    )
    return path
