"""Drives `deermem mcp` with the official MCP Python SDK (the `mcp` package from PyPI).

Run by crates/deermem-cli/tests/mcp_python_sdk.rs, once over stdio (the SDK spawns the
binary) and once over streamable HTTP (a server the Rust test started). For each way the SDK
negotiates a protocol version (the `initialize` handshake, auto discovery, and the 2026-07-28
per-request envelope) it checks: the negotiated version, the tool list and its schemas, the
add/search/update/delete cycle (a search by `mode`, and the modes refused without an
embedder or unknown), `memory_context`, the `memory://facts` resource, the raw user
id on facts, JSON-RPC errors (`-32602` for an unknown tool and for bad params of a known
method), concurrent calls, and a lone UTF-16 surrogate (which the SDK itself cannot send, so
that request goes through a transport of ours that writes JSON as JavaScript does). Over
HTTP it also checks that two tokens used at once see only their own facts.

Exits 0 when everything held; otherwise prints what failed and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

TOOLS = ["memory_search", "memory_add", "memory_update", "memory_delete", "memory_context"]
MODES = [("legacy", "2025-11-25"), ("auto", "2026-07-28"), ("2026-07-28", "2026-07-28")]
LIMITS = {"content": 20000, "query": 4096, "category": 128}
OVERALL_TIMEOUT_S = 240


class Failure(Exception):
    pass


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Failure(what)


def text_json(result: types.CallToolResult) -> Any:
    check(len(result.content) == 1, f"one content block: {result}")
    return json.loads(result.content[0].text)


async def expect_error(awaitable, code: int, fragment: str, what: str) -> None:
    try:
        result = await awaitable
    except MCPError as e:
        check(e.code == code, f"{what}: code {e.code} ({e.message}), wanted {code}")
        check(fragment in e.message, f"{what}: {e.message!r} lacks {fragment!r}")
        return
    raise Failure(f"{what}: no error, got {result}")


async def check_tools(client: Client) -> None:
    listed = await client.list_tools()
    names = [t.name for t in listed.tools]
    check(names == TOOLS, f"tools {names}")
    for tool in listed.tools:
        for prop, spec in tool.input_schema.get("properties", {}).items():
            check(isinstance(spec.get("type"), str), f"{tool.name}.{prop}: one type, got {spec}")
            check(spec.get("default", "") is not None, f"{tool.name}.{prop}: null default")
            if prop in LIMITS and spec["type"] == "string":
                check(spec.get("maxLength") == LIMITS[prop], f"{tool.name}.{prop}: {spec}")
    search = next(t for t in listed.tools if t.name == "memory_search")
    mode = search.input_schema["properties"].get("mode", {})
    check(mode.get("enum") == ["bm25", "vector", "hybrid"], f"memory_search.mode: {mode}")


async def cycle(client: Client, tag: str, user: str) -> None:
    added = await client.call_tool("memory_add", {"content": f"{tag} drinks oolong tea"})
    check(not added.is_error, f"add: {added}")
    fact_id = text_json(added)["fact_id"]
    found = text_json(await client.call_tool("memory_search", {"query": f"{tag} oolong"}))
    hits = [f for f in found["results"] if f["id"] == fact_id]
    check(len(hits) == 1, f"search found the fact: {found}")
    by_words = text_json(await client.call_tool("memory_search", {"query": f"{tag} oolong", "mode": "bm25"}))
    check([f["id"] for f in by_words["results"]] == [fact_id], f"search with mode bm25: {by_words}")
    check(hits[0]["scope"]["userId"] == user, f"raw user id on the fact: {hits[0]['scope']}")
    updated = await client.call_tool(
        "memory_update", {"fact_id": fact_id, "content": f"{tag} drinks green tea"}
    )
    check(text_json(updated) == {"fact_id": fact_id, "status": "updated"}, f"update: {updated}")
    block = await client.call_tool("memory_context", {})
    check(not block.is_error and block.content[0].text.startswith("<memory>"), f"context: {block}")
    facts = await client.read_resource("memory://facts", cache_mode="bypass")
    listed = json.loads(facts.contents[0].text)
    check(any(f["id"] == fact_id for f in listed["facts"]), f"resource: {listed}")
    deleted = await client.call_tool("memory_delete", {"fact_id": fact_id})
    check(text_json(deleted)["status"] == "deleted", f"delete: {deleted}")
    gone = await client.call_tool("memory_delete", {"fact_id": fact_id})
    check(gone.is_error and "Fact not found" in text_json(gone)["error"], f"delete twice: {gone}")


async def errors(client: Client) -> None:
    await expect_error(client.call_tool("memory_nope", {}), -32602, "Unknown tool", "unknown tool")
    bad = [
        ({"name": "memory_search", "arguments": ["tea"]}, "'arguments' must be an object"),
        ({"name": 5}, "'name' must be a string"),
        ({"arguments": {}}, "'name'"),
    ]
    for params, fragment in bad:
        request = types.Request[Any, str](method="tools/call", params=params)
        await expect_error(
            client.session.send_request(request, types.CallToolResult), -32602, fragment, f"params {params}"
        )
    request = types.Request[Any, str](method="resources/read", params={})
    await expect_error(
        client.session.send_request(request, types.ReadResourceResult), -32602, "uri", "read without uri"
    )
    for mode, fragment in [
        ("vector", "search mode vector needs an embedder: set backend_config.embedding"),
        ("semantic", "'mode': \"semantic\" is not a search mode; use bm25, vector or hybrid"),
    ]:
        r = await client.call_tool("memory_search", {"query": "tea", "mode": mode})
        check(r.is_error and fragment in text_json(r)["error"], f"mode {mode}: {r}")
    too_long = await client.call_tool("memory_add", {"content": "x" * 20001})
    check(too_long.is_error and "too long" in text_json(too_long)["error"], f"limit: {too_long}")


async def concurrency(client: Client, tag: str, n: int = 20) -> None:
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        if i % 2 == 0:
            r = await client.call_tool("memory_add", {"content": f"{tag} parallel fact number {i}"})
        else:
            r = await client.call_tool("memory_search", {"query": f"{tag} parallel"})
        check(not r.is_error, f"parallel call {i}: {r}")
        results[i] = text_json(r)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    ids = {results[i]["fact_id"] for i in range(0, n, 2)}
    check(len(ids) == n // 2, f"{n // 2} distinct facts added at once: {ids}")
    found = text_json(await client.call_tool("memory_search", {"query": f"{tag} parallel", "limit": 100}))
    check({f["id"] for f in found["results"]} >= ids, f"every parallel fact is stored: {found}")


async def session(target: Any, mode: str, version: str, user: str, tag: str) -> None:
    async with Client(target, mode=mode) as client:
        check(client.protocol_version == version, f"{mode}: negotiated {client.protocol_version}")
        await check_tools(client)
        await cycle(client, tag, user)
        await errors(client)
        await concurrency(client, tag)


class JsStyleStdio:
    """A stdio transport writing each message with JSON escapes as JavaScript does, so a lone
    surrogate in a string reaches the server as `\\udXXX` (the SDK's own writer refuses it)."""

    def __init__(self, command: str, args: list[str]):
        self.command = command
        self.args = args
        self._cm = None

    @asynccontextmanager
    async def _open(self):
        process = await anyio.open_process(
            [self.command, *self.args], env=get_default_environment(), stderr=sys.stderr
        )
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](16)

        async def reader() -> None:
            buffer = b""
            async with to_session:
                async for chunk in process.stdout:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                            await to_session.send(SessionMessage(message))

        async def writer() -> None:
            async with from_session:
                async for item in from_session:
                    data = item.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
                    await process.stdin.send((json.dumps(data, ensure_ascii=True) + "\n").encode())

        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                await process.stdin.aclose()
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                tg.cancel_scope.cancel()

    async def __aenter__(self):
        self._cm = self._open()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc):
        return await self._cm.__aexit__(*exc)


async def lone_surrogate_stdio(command: str, args: list[str]) -> None:
    async with Client(JsStyleStdio(command, args), mode="legacy") as client:
        with anyio.fail_after(30):
            added = await client.call_tool("memory_add", {"content": "broken \ud83c emoji over stdio"})
        check(not added.is_error, f"lone surrogate over stdio: {added}")
        found = text_json(await client.call_tool("memory_search", {"query": "broken emoji stdio"}))
        contents = [f["content"] for f in found["results"]]
        check("broken \ufffd emoji over stdio" in contents, f"stored with U+FFFD: {contents}")


async def lone_surrogate_http(url: str, token: str) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 901,
        "method": "tools/call",
        "params": {"name": "memory_add", "arguments": {"content": "broken \ud83c emoji over http"}},
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(url, content=json.dumps(body, ensure_ascii=True), headers=headers)
    check(response.status_code == 200, f"lone surrogate over HTTP: {response.status_code} {response.text}")
    answer = response.json()
    check(answer.get("id") == 901, f"answered with the request id: {answer}")
    check(answer["result"]["isError"] is False, f"stored: {answer}")


def http_client(token: str) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def isolation(url: str, token: str, other_token: str) -> None:
    """Two users at once over HTTP: each sees only their own facts."""

    async def user(tok: str, tag: str) -> set[str]:
        async with Client(streamable_http_client(url, http_client=http_client(tok))) as client:
            ids = set()
            for i in range(10):
                r = await client.call_tool("memory_add", {"content": f"{tag} isolationcheck fact {i}"})
                ids.add(text_json(r)["fact_id"])
            found = text_json(await client.call_tool("memory_search", {"query": "isolationcheck", "limit": 100}))
            seen = {f["content"].split()[0] for f in found["results"]}
            check(seen == {tag}, f"{tag} sees only their own facts: {seen}")
            check({f["id"] for f in found["results"]} == ids, f"{tag} finds all ten: {found}")
            return ids

    async with anyio.create_task_group() as tg:
        tg.start_soon(user, token, "alpha")
        tg.start_soon(user, other_token, "beta")


async def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="transport", required=True)
    stdio = sub.add_parser("stdio")
    stdio.add_argument("--deermem", required=True)
    stdio.add_argument("--root", required=True)
    stdio.add_argument("--user", required=True)
    http = sub.add_parser("http")
    http.add_argument("--url", required=True)
    http.add_argument("--token", required=True)
    http.add_argument("--other-token", required=True)
    http.add_argument("--user", required=True)
    a = parser.parse_args()

    with anyio.fail_after(OVERALL_TIMEOUT_S):
        if a.transport == "stdio":
            args = ["--storage-path", a.root, "mcp", "--user", a.user]
            params = StdioServerParameters(command=a.deermem, args=args)
            for mode, version in MODES:
                await session(params, mode, version, a.user, "stdio" + mode.replace("-", ""))
            await lone_surrogate_stdio(a.deermem, args)
        else:
            for mode, version in MODES:
                target = streamable_http_client(a.url, http_client=http_client(a.token))
                await session(target, mode, version, a.user, "http" + mode.replace("-", ""))
            await lone_surrogate_http(a.url, a.token)
            await isolation(a.url, a.token, a.other_token)
    print(f"mcp_sdk_client {a.transport}: all checks held")


def failures(error: BaseException) -> list[Failure]:
    """The check failures inside `error` (task groups wrap them in exception groups)."""
    if isinstance(error, Failure):
        return [error]
    return [f for inner in getattr(error, "exceptions", ()) for f in failures(inner)]


if __name__ == "__main__":
    try:
        anyio.run(main)
    except BaseException as e:
        found = failures(e)
        if not found:
            raise
        for f in found:
            print(f"FAILED: {f}", file=sys.stderr)
        sys.exit(1)
