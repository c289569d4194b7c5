"""PyYAML oracle for the Rust YAML front-matter codec's interop tests.

Reads one JSON request per line on stdin and writes one JSON answer per line on stdout:

* {"op": "load", "text": "..."}  -> {"ok": <yaml.safe_load(text) as JSON>} or {"err": "..."}
* {"op": "dump", "value": {...}} -> {"ok": yaml.safe_dump(value, allow_unicode=True,
                                        sort_keys=False) without its final line breaks}

Values JSON cannot hold are marked so the Rust side can compare them: a date or datetime
becomes "__timestamp__", a NaN "__nan__", an infinity "__inf__" or "__-inf__", any other
non-JSON object "__<type name>__". Finite floats become {"__float__": repr(f)} so that no JSON
float parsing can blur the comparison. Mapping keys that are not strings become the text
json.dumps would use (true, false, null, 12, 1.5).
"""

import datetime
import json
import math
import sys

import yaml


def key_text(k):
    if isinstance(k, str):
        return k
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, float):
        if math.isnan(k):
            return ".nan"
        if math.isinf(k):
            return ".inf" if k > 0 else "-.inf"
        return repr(k)
    if isinstance(k, (datetime.date, datetime.datetime)):
        return "__timestamp__"
    return str(k)


def to_json(v):
    if isinstance(v, dict):
        return {key_text(k): to_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_json(x) for x in v]
    if isinstance(v, (datetime.date, datetime.datetime)):
        return "__timestamp__"
    if isinstance(v, float):
        if math.isnan(v):
            return "__nan__"
        if math.isinf(v):
            return "__inf__" if v > 0 else "__-inf__"
        return {"__float__": repr(v)}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return f"__{type(v).__name__}__"


def answer(req):
    try:
        if req["op"] == "load":
            return {"ok": to_json(yaml.safe_load(req["text"]))}
        if req["op"] == "dump":
            out = yaml.safe_dump(req["value"], allow_unicode=True, sort_keys=False)
            return {"ok": out.rstrip("\n")}
        return {"err": "unknown op"}
    except Exception as exc:  # noqa: BLE001 - every failure is an answer
        return {"err": f"{type(exc).__name__}: {exc}"}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        sys.stdout.write(json.dumps(answer(json.loads(line)), ensure_ascii=True) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
