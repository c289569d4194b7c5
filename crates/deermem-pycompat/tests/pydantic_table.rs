//! Holds `deermem_pycompat::lax` to pydantic's own answers: `tests/pydantic/lax_table.json`,
//! written by `tests/pydantic/generate.py` with pydantic 2 (inputs × field types: bool, int,
//! float, str, list, optional and constrained fields), one row at a time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem_pycompat::lax::{self, LaxError};
use deermem_pycompat::py::parse_float;
use serde_json::Value;

/// What our parser makes of `input` for the table's field type `ty`: the value, or the error
/// type.
fn ours(ty: &str, input: &Value) -> Result<Value, LaxError> {
    Ok(match ty {
        "bool" => Value::Bool(lax::bool(input)?),
        "int" => lax::int(input)?.into(),
        "float" => float_value(lax::float(input)?),
        "str" => lax::string(input)?.into(),
        "list[str]" => lax::list(input)?
            .iter()
            .map(|item| lax::string(item).map(Value::from))
            .collect::<Result<Vec<_>, _>>()?
            .into(),
        "optional[int]" if input.is_null() => Value::Null,
        "optional[int]" => lax::int(input)?.into(),
        "float[0,1]" => float_value(lax::bounded(lax::float(input)?, Some(0.0), Some(1.0))?),
        "int>=1" => lax::bounded(lax::int(input)?, Some(1), None)?.into(),
        "str(min_length=1)" => lax::min_chars(lax::string(input)?, 1)?.into(),
        other => panic!("the table has a field type the test does not know: {other}"),
    })
}

/// Floats are compared through their text (nan and the infinities are not JSON numbers).
fn float_value(f: f64) -> Value {
    Value::String(format!("float:{f:?}"))
}

fn expected(ty: &str, ok: &str) -> Value {
    if ty.starts_with("float") {
        let f = parse_float(ok).unwrap_or_else(|| panic!("a float repr: {ok}"));
        float_value(f)
    } else {
        serde_json::from_str(ok).unwrap()
    }
}

#[test]
fn every_row_of_pydantics_table_holds() {
    let text = include_str!("pydantic/lax_table.json");
    let table: Value = serde_json::from_str(text).unwrap();
    let rows = table["rows"].as_array().unwrap();
    assert!(rows.len() > 600, "the whole table is read");
    let mut wrong = Vec::new();
    for row in rows {
        let ty = row["type"].as_str().unwrap();
        let input_text = row["input"].as_str().unwrap();
        let input: Value = serde_json::from_str(input_text).unwrap();
        let got = ours(ty, &input);
        let fits = match (row.get("ok").and_then(Value::as_str), &got) {
            (Some(ok), Ok(v)) => {
                let want = expected(ty, ok);
                // nan is not equal to itself; its text is.
                *v == want
            }
            (None, Err(e)) => row["error"].as_str() == Some(e.kind),
            _ => false,
        };
        if !fits {
            wrong.push(format!(
                "{ty} {input_text}: pydantic {} / ours {got:?}",
                row.get("ok").or(row.get("error")).unwrap()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} rows differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn messages_are_pydantics() {
    let e = lax::int(&Value::from("x")).unwrap_err();
    assert_eq!(
        e.message,
        "Input should be a valid integer, unable to parse string as an integer"
    );
    let e = lax::bounded(2.0, Some(0.0), Some(1.0)).unwrap_err();
    assert_eq!(e.message, "Input should be less than or equal to 1");
    let e = lax::min_chars("", 1).unwrap_err();
    assert_eq!(e.message, "String should have at least 1 character");
}
