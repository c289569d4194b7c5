#!/usr/bin/env python3
"""A writer speaking the DeerMem reference's lock and file format, for the interoperability
test under load: for each fact it takes the exclusive BSD flock on <user dir>/.memory.lock,
reads the manifest revision, writes one Markdown fact (PyYAML front matter) atomically, then
the manifest at revision + 1 atomically, and releases the lock.

Usage: py_writer.py <root> <bucket> <raw user id> <agent> <count> <id prefix>
"""

import datetime
import fcntl
import hashlib
import json
import os
import sys
import uuid

import yaml


def atomic_write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + "." + uuid.uuid4().hex + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main():
    root, bucket, raw_user, agent, count, prefix = sys.argv[1:7]
    user_dir = os.path.join(root, "users", bucket)
    os.makedirs(user_dir, exist_ok=True)
    for i in range(int(count)):
        fact_id = f"{prefix}{i}"
        with open(os.path.join(user_dir, ".memory.lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            manifest_path = os.path.join(user_dir, "memory.json")
            manifest = {}
            if os.path.exists(manifest_path):
                with open(manifest_path, encoding="utf-8") as handle:
                    manifest = json.load(handle)
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            meta = {
                "category": "context",
                "confidence": 0.75,
                "topics": ["python", "yes", "1:30"],
                "source": {"type": "manual", "threadId": None},
                "id": fact_id,
                "schemaVersion": 2,
                "status": "active",
                "consolidatedFrom": [],
                "createdAt": now,
                "updatedAt": now,
                "revision": 1,
                "user_id": raw_user,
                "agent_name": agent,
            }
            front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
            body = f"---\n{front}---\n\nWritten by Python {i}: likes 乌龙茶 and yes: no\n"
            shard = hashlib.sha256(fact_id.encode("utf-8")).hexdigest()[:2]
            atomic_write(os.path.join(user_dir, "agents", agent, "facts", shard, fact_id + ".md"), body)
            manifest = {
                "version": "2.0",
                "revision": int(manifest.get("revision", 0)) + 1,
                "lastUpdated": now,
                "user": manifest.get("user", {}),
                "history": manifest.get("history", {}),
            }
            atomic_write(manifest_path, json.dumps(manifest, ensure_ascii=False, indent=2))
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


if __name__ == "__main__":
    main()
