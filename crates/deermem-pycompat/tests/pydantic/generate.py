"""Writes lax_table.json beside this script: what pydantic 2 (lax mode, Python input, as FastAPI
and DeerFlow's config models validate) answers for each JSON input and field type. Run once
with pydantic installed, e.g.

    python3 -m venv target/pydantic-venv
    target/pydantic-venv/bin/pip install "pydantic==2.14.4"
    target/pydantic-venv/bin/python crates/deermem-pycompat/tests/pydantic/generate.py

Each row: the field type, the input as JSON text, and either ``ok`` (the validated value as
JSON text, floats written as Python's repr so nan and inf survive) or ``error`` (pydantic's
error type). The Rust test ``pydantic_table`` holds deermem_pycompat::lax to every row."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Optional

import pydantic
from pydantic import Field, TypeAdapter, ValidationError

TYPES = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "list[str]": list[str],
    "optional[int]": Optional[int],
    "float[0,1]": Annotated[float, Field(ge=0, le=1)],
    "int>=1": Annotated[int, Field(ge=1)],
    "str(min_length=1)": Annotated[str, Field(min_length=1)],
}

INPUTS = [
    "null", "true", "false",
    "0", "1", "2", "-1", "0.0", "-0.0", "1.0", "0.5", "3.0", "3.5", "-7.0", "1e16", "1.5e3",
    "9007199254740993", "-9223372036854775808", "9223372036854775807",
    '""', '" "', '"0"', '"1"', '"2"', '"yes"', '"YES"', '"no"', '"on"', '"oN"', '"off"', '"t"',
    '"f"', '"y"', '"n"', '"true"', '"False"', '" yes"', '"maybe"', '"1.0"',
    '"20"', '" 20 "', '"20.0"', '"20.00"', '"20."', '"20.5"', '"+5"', '"-5"', '"1_000"',
    '"1__0"', '"_1"', '"1_"', '"0x10"', '"1e3"', '"2.5"', '" 2.5 "', '".5"', '"5."', '"-0"',
    '"007"', '"nan"', '"NaN"', '"inf"', '"-inf"', '"+inf"', '"infinity"', '"-Infinity"',
    '"1_000.5"', '"\\u3000 5"', '"\\u0663"', '"abc"', '"a"',
    "[]", '["a"]', '["a", 1]', "[1]", "{}", '{"a": 1}',
]


def shown(value):
    """The validated value as JSON text; a float as its repr."""
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def main() -> None:
    rows = []
    for name, typ in TYPES.items():
        adapter = TypeAdapter(typ)
        for text in INPUTS:
            value = json.loads(text)
            row = {"type": name, "input": text}
            try:
                row["ok"] = shown(adapter.validate_python(value))
            except ValidationError as e:
                row["error"] = e.errors()[0]["type"]
            rows.append(row)
    out = {"pydantic": pydantic.VERSION, "rows": rows}
    path = Path(__file__).with_name("lax_table.json")
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(rows)} rows from pydantic {pydantic.VERSION} -> {path}")
    assert not any(isinstance(r.get("ok"), float) and math.isnan(r["ok"]) for r in rows)


if __name__ == "__main__":
    main()
