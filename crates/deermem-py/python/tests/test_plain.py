"""Outside DeerFlow: without ``deerflow`` importable, ``DeerMemManager`` is a plain class with
the same methods, and the memory errors are classes of ``deermem_rs`` itself. Run in a fresh
interpreter, since this suite's process has the stand-in DeerFlow importable."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_without_deerflow_the_class_and_errors_are_the_packages_own(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        sys.path = [p for p in sys.path if "stand_in" not in p]
        import deermem_rs
        from deermem_rs import DeerMemManager, MemoryConflictError, MemoryCorruptionError
        from deermem_rs._errors import FROM_DEERFLOW, MemoryManagerError
        assert not FROM_DEERFLOW
        assert "deerflow" not in sys.modules
        assert DeerMemManager.__mro__[1].__name__ == "_Methods"
        assert issubclass(MemoryConflictError, MemoryManagerError)
        assert issubclass(MemoryCorruptionError, RuntimeError)
        assert MemoryConflictError.__module__ == "deermem_rs._errors"
        m = DeerMemManager.from_config({{"storage_path": {str(tmp_path / "root")!r}}}, mode="tool")
        assert m.mode == "tool" and DeerMemManager.supports_search
        _, fid = m.create_fact("User paints", user_id="u")
        old = m.export_memory(user_id="u")
        m.update_fact(fid, content="User paints murals", user_id="u")
        try:
            m.import_memory(old, user_id="u")
        except MemoryConflictError:
            pass
        else:
            raise AssertionError("expected a conflict")
        try:
            DeerMemManager(backend_config={{}}, mode="sometimes")
        except ValueError:
            pass
        else:
            raise AssertionError("expected a ValueError for the mode")
        m.close()
        print("plain ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "plain ok"
