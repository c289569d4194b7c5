#!/usr/bin/env python3
"""Reads a DeerMem storage root the way the Python reference reads it and prints it as JSON.

Fact files are split into front matter and body exactly as the reference's parser does and
the front matter goes through PyYAML's safe_load; JSON files go through json.loads. Any value
PyYAML types as something JSON cannot hold (a datetime from an unquoted timestamp, for
example) makes json.dumps fail, so the calling test fails visibly.

Usage: load_root.py <root>
"""

import json
import pathlib
import sys

import yaml


def parse_fact(path):
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        raise ValueError(f"{path}: missing YAML front matter")
    front, body = text[4:].split("\n---\n", 1)
    meta = yaml.safe_load(front) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: front matter is not a mapping")
    lines = body.lstrip("\n").splitlines()
    title = ""
    if lines and lines[0].startswith("# "):
        title = lines.pop(0)[2:].strip()
        if lines and not lines[0].strip():
            lines.pop(0)
    meta["title"] = title
    meta["content"] = "\n".join(lines).rstrip("\n")
    for key in ("createdAt", "updatedAt"):
        if key in meta and not isinstance(meta[key], str):
            raise TypeError(f"{path}: {key} is {type(meta[key]).__name__}, not a string")
    return meta


def main():
    root = pathlib.Path(sys.argv[1])
    out = {"facts": {}, "json": {}}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".md" and "/facts/" in f"/{rel}":
            out["facts"][rel] = parse_fact(path)
        elif path.suffix == ".json":
            out["json"][rel] = json.loads(path.read_text(encoding="utf-8"))
    sys.stdout.write(json.dumps(out, allow_nan=False))


if __name__ == "__main__":
    main()
