"""Threads, the event loop, the shutdown drain and fork: 16 Python threads calling at once,
async methods inside a running loop that keeps running, ``shutdown_flush`` with pending work
and a hard timeout, and a forked child using the package on its own runtime."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from deerflow.host import ai, human
from helpers import ScriptedModel, fact, turn, update

import deermem_rs._native as native

THREADS = 16


def test_sixteen_threads_call_every_operation_at_once(make):
    m = make()
    barrier = threading.Barrier(THREADS)

    def worker(i: int) -> tuple[int, int]:
        barrier.wait()
        own = f"user-{i}"
        for j in range(5):
            m.create_fact(f"Thread {i} fact {j} about kayaks", user_id=own)
            m.create_fact(f"Shared fact {i}-{j} about canoes", user_id="shared")
        m.add(f"t{i}", turn(f"I prefer kayak number {i} for rivers."), user_id=own)
        context = m.get_context(own)
        hits = m.search("kayaks", top_k=10, user_id=own)
        m.update_fact(hits[0]["id"], confidence=0.99, user_id=own)
        m.delete_fact(hits[1]["id"], user_id=own)
        return context.count("kayaks"), len(m.get_memory(user_id=own)["facts"])

    with ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))
    assert all(seen == 5 for seen, _ in results), results
    assert all(count == 4 for _, count in results), results
    shared = m.get_memory(user_id="shared")["facts"]
    assert len(shared) == THREADS * 5, "every concurrent write to one user was kept"
    assert m.shutdown_flush(30)


def test_the_gil_is_released_while_the_engine_waits_for_python(make):
    # The drain below waits for the host model, which is Python code run by an engine thread:
    # it can only finish while the flushing thread does not hold the GIL.
    model = ScriptedModel([update(fact("User rows at dawn"))])
    m = make(host_llm_factory=lambda: model)
    m.add("g", turn("I row at dawn."), user_id="kai")
    assert m.shutdown_flush(30) is True
    assert model.calls and [f["content"] for f in m.get_memory(user_id="kai")["facts"]] == [
        "User rows at dawn"
    ]


def test_async_methods_run_inside_a_running_loop(make):
    m = make()
    m.create_fact("User cooks ramen on Sundays", user_id="lin")

    async def main():
        context, hits = await asyncio.gather(
            m.aget_context("lin"), m.asearch("ramen", user_id="lin")
        )
        await m.aadd("a", turn("I prefer miso ramen over shoyu."), user_id="lin", trace_id="tr")
        many = await asyncio.gather(*(m.aget_context("lin") for _ in range(32)))
        return context, hits, many

    context, hits, many = asyncio.run(main())
    assert context == m.get_context("lin") and "ramen" in context
    assert hits == m.search("ramen", user_id="lin")
    assert set(many) == {context}
    assert m.shutdown_flush(30)
    assert len(m.get_memory(user_id="lin")["facts"]) >= 2


def test_an_awaiting_add_leaves_the_event_loop_free(make):
    # The hidden-message hook blocks until a coroutine on the loop releases it: if `aadd` ran
    # on the loop's thread, that coroutine could never run.
    released = threading.Event()
    outcome = {}

    def keep(kwargs):
        outcome["released_by_loop"] = released.wait(10)
        return True

    m = make(should_keep_hidden_message=keep)

    async def release():
        await asyncio.sleep(0)
        released.set()

    async def main():
        messages = [
            human("Pick one", id="h0"),
            ai("A or B?", id="a0"),
            human("I prefer option B for the ledger", additional_kwargs={"hide_from_ui": True}, id="h1"),
            ai("B it is.", id="a1"),
        ]
        await asyncio.gather(m.aadd("loop", messages, user_id="mo"), release())

    asyncio.run(main())
    assert outcome == {"released_by_loop": True}


def test_shutdown_flush_has_a_hard_timeout_with_pending_work(make):
    gate = threading.Event()
    model = ScriptedModel([lambda prompt: gate.wait(30) and update(fact("User climbs in Yosemite"))])
    m = make(host_llm_factory=lambda: model)
    m.add("slow", turn("I climb in Yosemite."), user_id="nia")
    assert m.shutdown_flush(0.3) is False, "the drain cannot finish while the model is blocked"
    assert not model.finished.is_set(), "it returned while the work was still pending"
    gate.set()
    assert m.shutdown_flush(30) is True
    assert [f["content"] for f in m.get_memory(user_id="nia")["facts"]] == ["User climbs in Yosemite"]


def test_a_forked_child_uses_the_package_on_its_own_runtime(make):
    m = make()
    m.create_fact("Parent fact before the fork", user_id="olu")
    parent_pid = os.getpid()
    assert native.runtime_pid() == parent_pid
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            before = [f["content"] for f in m.get_memory(user_id="olu")["facts"]]
            m.create_fact("Child fact after the fork", user_id="olu")
            m.add("child", turn("I prefer sourdough bread for breakfast."), user_id="olu-child")
            drained = m.shutdown_flush(30)
            ok = (
                before == ["Parent fact before the fork"]
                and native.runtime_pid() == os.getpid()
                and drained
                and m.get_memory(user_id="olu-child")["facts"]
                and "Child fact after the fork" in m.get_context("olu")
            )
            os.write(write_end, b"ok" if ok else repr(before).encode())
            code = 0
        except BaseException as e:  # report anything to the parent
            os.write(write_end, repr(e).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    report = os.read(read_end, 4096).decode()
    os.close(read_end)
    assert os.waitstatus_to_exitcode(status) == 0 and report == "ok", report
    # The parent goes on with its own engine and sees the child's committed write.
    assert native.runtime_pid() == parent_pid
    contents = {f["content"] for f in m.reload_memory(user_id="olu")["facts"]}
    assert contents == {"Parent fact before the fork", "Child fact after the fork"}
