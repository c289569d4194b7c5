"""Benchmark of the deermem_rs package: per-call latency through Python for a 100-fact user
(``get_context``, ``search``, ``add`` as an enqueue) and how ``get_context`` throughput scales
from one Python thread to two (the GIL is released during engine calls).

Run with the package installed (``cargo xtask python`` leaves a venv under
``target/deermem-py/venv``)::

    target/deermem-py/venv/bin/python crates/deermem-py/bench.py [--json OUT]

Targets (reported, never asserted): ``get_context`` p50 under 100 us, ``search`` p50 under
150 us, ``add`` p50 under 50 us, and a 1 -> 2 thread ``get_context`` scaling above 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time

import deermem_rs

USER = "bench-user"
TOPICS = [
    "Rust", "Python", "Postgres", "Kubernetes", "coffee", "cycling", "jazz", "Lisbon",
    "payments", "tea", "chess", "sourdough", "hiking", "Go", "Vim", "TypeScript",
    "climbing", "sailing", "photography", "ramen",
]
CATEGORIES = ["preference", "context", "goal", "identity", "decision", "behavior"]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(fn, n: int) -> dict[str, float]:
    samples = []
    for i in range(n):
        t = time.perf_counter_ns()
        fn(i)
        samples.append((time.perf_counter_ns() - t) / 1000.0)
    return {
        "n": n,
        "p50_us": statistics.median(samples),
        "p90_us": percentile(samples, 0.9),
        "p99_us": percentile(samples, 0.99),
    }


def throughput(fn, threads: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    counts = [0] * threads
    barrier = threading.Barrier(threads)

    def worker(k: int) -> None:
        barrier.wait()
        while time.monotonic() < stop:
            fn()
            counts[k] += 1

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as root:
        m = deermem_rs.DeerMemManager.from_config(
            {"storage_path": root, "debounce_seconds": 300, "max_facts": 200}
        )
        for i in range(100):
            topic = TOPICS[i % len(TOPICS)]
            m.create_fact(
                f"User fact {i}: works with {topic} and mentions {TOPICS[(i * 7) % len(TOPICS)]}",
                CATEGORIES[i % len(CATEGORIES)],
                0.6 + (i % 4) / 10,
                user_id=USER,
            )
        assert len(m.get_memory(user_id=USER)["facts"]) == 100
        m.warm()
        m.warm_retrieval()
        for _ in range(200):  # steady state: caches and index warm
            m.get_context(USER)
            m.search("Rust", user_id=USER)
        messages = [
            {"role": "user", "content": "I prefer green tea in the afternoon.", "id": "u"},
            {"role": "assistant", "content": "Noted.", "id": "a"},
        ]
        results = {
            "get_context": measure(lambda i: m.get_context(USER), args.calls),
            "search": measure(lambda i: m.search(TOPICS[i % len(TOPICS)], user_id=USER), args.calls),
            "add": measure(lambda i: m.add("bench-thread", messages, user_id=USER), args.calls),
        }
        one = throughput(lambda: m.get_context(USER), 1, args.seconds)
        two = throughput(lambda: m.get_context(USER), 2, args.seconds)
        results["get_context_scaling"] = {
            "one_thread_per_s": one,
            "two_threads_per_s": two,
            "ratio": two / one,
        }
        m.shutdown_flush(30)
        m.close()

    targets = {"get_context": 100.0, "search": 150.0, "add": 50.0}
    print(f"deermem_rs {deermem_rs.__version__}: 100-fact user, {args.calls} calls each")
    print(f"{'operation':<12} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9}  target")
    for name, target in targets.items():
        r = results[name]
        verdict = "ok" if r["p50_us"] < target else "MISS"
        print(
            f"{name:<12} {r['p50_us']:>9.1f} {r['p90_us']:>9.1f} {r['p99_us']:>9.1f}"
            f"  p50 < {target:.0f} us {verdict}"
        )
    s = results["get_context_scaling"]
    print(
        f"get_context throughput: 1 thread {s['one_thread_per_s']:,.0f}/s, "
        f"2 threads {s['two_threads_per_s']:,.0f}/s (x{s['ratio']:.2f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
