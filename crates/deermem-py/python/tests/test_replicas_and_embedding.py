"""The package built with PostgreSQL storage and the embedders: two engines on one throwaway
PostgreSQL cluster serve one memory (as two DeerFlow processes would), and an OpenAI-compatible
embedding server on loopback ranks search by meaning."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import config

PG_DIRS = [os.environ.get("DEERMEM_PG_BIN", "")] + sorted(
    (str(p) for p in Path("/usr/lib/postgresql").glob("*/bin")), reverse=True
)


def _pg_bin() -> Path:
    for d in PG_DIRS:
        if d and (Path(d) / "initdb").is_file() and (Path(d) / "pg_ctl").is_file():
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    pytest.fail(
        f"no PostgreSQL server binaries (initdb, pg_ctl) in {PG_DIRS} or PATH: "
        "install them with `apt-get install postgresql`"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pg_url():
    """A throwaway cluster (run as an unprivileged user when the tests run as root)."""
    bin_dir = _pg_bin()
    data = Path(tempfile.mkdtemp(prefix="deermem-py-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = "postgres" if subprocess.run(["id", "postgres"], capture_output=True).returncode == 0 else "nobody"
        subprocess.run(["chown", user, str(data)], check=True)
        prefix = ["runuser", "-u", user, "--"]
    pgdata = data / "data"
    subprocess.run(
        prefix + [str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    opts = f"-c listen_addresses=127.0.0.1 -c port={port} -k {data} -c fsync=off"
    subprocess.run(
        prefix + [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-o", opts, "-l", str(data / "log"), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            prefix + [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-m", "immediate", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(data, ignore_errors=True)


def test_two_engines_on_one_database_serve_one_memory(make, tmp_path, pg_url):
    # Different storage paths give two engines (two replicas); the memory is in the database.
    pg = {"storage_class": "postgres", "postgres": {"url": pg_url, "schema": "py_replicas"}}
    a = make(backend_config=config(tmp_path / "replica-a", **pg))
    b = make(backend_config=config(tmp_path / "replica-b", **pg))
    assert a._engine.key != b._engine.key
    _, fid = a.create_fact("Keeps a sourdough starter named Clint", "context", 0.9, user_id="rosa")
    assert fid
    # B sees A's acknowledged write at once: by id, in the document and through search.
    doc = b.get_memory(user_id="rosa")
    assert [f["content"] for f in doc["facts"]] == ["Keeps a sourdough starter named Clint"]
    assert [h["id"] for h in b.search("sourdough", user_id="rosa")] == [fid]
    # A write through B (an update at the next revision) is what A reads next.
    b.update_fact(fid, content="Keeps a sourdough starter named Clint Yeastwood", user_id="rosa")
    assert a.get_memory(user_id="rosa")["facts"][0]["content"] == (
        "Keeps a sourdough starter named Clint Yeastwood"
    )
    assert a.get_memory(user_id="rosa")["revision"] == b.get_memory(user_id="rosa")["revision"]
    b.delete_fact(fid, user_id="rosa")
    assert a.search("sourdough", user_id="rosa") == []
    # Nothing was written under either storage path: the facts live in the database.
    written = [p for p in tmp_path.rglob("*.md")]
    assert written == []


# -- an OpenAI-compatible embedding server on loopback ----------------------------------------

DRINKS = ("tea", "coffee", "drink", "espresso")


def _vector(text: str) -> list[float]:
    """A two-concept toy model: beverages on the first axis, everything else on the second."""
    lowered = text.lower()
    return [1.0, 0.0] if any(w in lowered for w in DRINKS) else [0.0, 1.0]


class _Embeddings(BaseHTTPRequestHandler):
    calls: list[list[str]] = []

    def do_POST(self):  # noqa: N802 (the http.server naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        type(self).calls.append(inputs)
        answer = {
            "object": "list",
            "model": body.get("model", "toy"),
            "data": [
                {"object": "embedding", "index": i, "embedding": _vector(t)}
                for i, t in enumerate(inputs)
            ],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
        raw = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def embedding_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
    _Embeddings.calls = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_openai_compatible_embedder_ranks_search_by_meaning(make, root, embedding_server):
    cfg = config(
        root,
        embedding={"provider": "openai", "base_url": embedding_server, "model": "toy", "dimensions": 2, "max_retries": 0},
    )
    m = make(backend_config=cfg)
    m.create_fact("Prefers oolong tea", "preference", 0.9, user_id="ines")
    m.create_fact("Works at a robotics startup", "context", 0.9, user_id="ines")
    question = "what is her usual morning drink"
    # No word is shared: BM25 finds nothing, the vector and hybrid modes find the tea.
    assert m.search(question, user_id="ines", mode="bm25") == []
    assert m.search(question, 1, user_id="ines", mode="vector")[0]["content"] == "Prefers oolong tea"
    assert m.search(question, 1, user_id="ines")[0]["content"] == "Prefers oolong tea"
    assert any(question in inputs for inputs in _Embeddings.calls)
