//! AMQP field tables ↔ JSON, for storing headers on records and republishing them.

use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{Map, Number, Value};

use crate::source::bytes_to_json;

/// A message nested deeper than this is poison (`HEADERS_TOO_DEEP`); its record keeps the
/// headers with deeper values replaced by the string [`TOO_DEEP`]: the conversion, JSON
/// serialisation and PostgreSQL's `jsonb` all recurse (lapin's parser too: `header_depth.rs`).
pub use crate::message::MAX_HEADER_DEPTH;

/// What stands in for a header value nested deeper than [`MAX_HEADER_DEPTH`].
pub const TOO_DEEP: &str = "(nested deeper than 32 levels; not kept)";

/// Converts an AMQP header table to a JSON object. Byte arrays and non-UTF-8 long strings
/// become arrays of numbers; decimals become numbers; timestamps their Unix seconds; values
/// nested deeper than [`MAX_HEADER_DEPTH`] the string [`TOO_DEEP`]. (The tests' view of what
/// a source keeps; the sources use [`headers_to_json`].)
#[cfg(feature = "testing")]
pub fn table_to_json(table: &FieldTable) -> Map<String, Value> {
    headers_to_json(table).0
}

/// [`table_to_json`], and whether some value was nested deeper than [`MAX_HEADER_DEPTH`].
pub fn headers_to_json(table: &FieldTable) -> (Map<String, Value>, bool) {
    let mut too_deep = false;
    let map = table_at(table, 1, &mut too_deep);
    (map, too_deep)
}

fn table_at(table: &FieldTable, depth: usize, too_deep: &mut bool) -> Map<String, Value> {
    table.inner().iter().map(|(k, v)| (k.as_str().to_owned(), value_to_json(v, depth, too_deep))).collect()
}

fn value_to_json(value: &AMQPValue, depth: usize, too_deep: &mut bool) -> Value {
    let nested = matches!(value, AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_));
    if nested && depth >= MAX_HEADER_DEPTH {
        *too_deep = true;
        return Value::String(TOO_DEEP.to_owned());
    }
    match value {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => Value::from(*n),
        AMQPValue::ShortShortUInt(n) => Value::from(*n),
        AMQPValue::ShortInt(n) => Value::from(*n),
        AMQPValue::ShortUInt(n) => Value::from(*n),
        AMQPValue::LongInt(n) => Value::from(*n),
        AMQPValue::LongUInt(n) => Value::from(*n),
        AMQPValue::LongLongInt(n) => Value::from(*n),
        AMQPValue::Float(f) => Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number),
        AMQPValue::Double(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        AMQPValue::DecimalValue(d) => {
            Number::from_f64(f64::from(d.value) / 10f64.powi(i32::from(d.scale))).map_or(Value::Null, Value::Number)
        }
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_owned()),
        AMQPValue::LongString(s) => bytes_to_json(s.as_bytes()),
        AMQPValue::FieldArray(a) => {
            Value::Array(a.as_slice().iter().map(|v| value_to_json(v, depth + 1, too_deep)).collect())
        }
        AMQPValue::Timestamp(t) => Value::from(*t),
        AMQPValue::FieldTable(t) => Value::Object(table_at(t, depth + 1, too_deep)),
        AMQPValue::ByteArray(b) => Value::Array(b.as_slice().iter().map(|x| Value::from(*x)).collect()),
        AMQPValue::Void => Value::Null,
    }
}

/// Converts a JSON object back to an AMQP header table (strings as long strings, integers as
/// 64-bit, other numbers as doubles, nested objects as tables).
pub fn json_to_table(map: &Map<String, Value>) -> FieldTable {
    let mut table = FieldTable::default();
    for (k, v) in map {
        table.insert(ShortString::from(k.as_str()), json_to_value(v));
    }
    table
}

fn json_to_value(value: &Value) -> AMQPValue {
    match value {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Value::Array(items) => {
            let mut array = FieldArray::default();
            for item in items {
                array.push(json_to_value(item));
            }
            AMQPValue::FieldArray(array)
        }
        Value::Object(map) => AMQPValue::FieldTable(json_to_table(map)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_json() {
        let json = serde_json::json!({
            "x-message-id": "ORDER.PAY.1:2",
            "n": 42,
            "ratio": 0.5,
            "ok": true,
            "nested": {"a": [1, "b"]},
            "none": null
        });
        let table = json_to_table(json.as_object().unwrap());
        assert_eq!(Value::Object(table_to_json(&table)), json);
    }

    #[test]
    fn binary_long_strings_become_byte_arrays() {
        let mut table = FieldTable::default();
        table.insert("bin".into(), AMQPValue::LongString(LongString::from(vec![0xffu8, 0x00])));
        assert_eq!(table_to_json(&table)["bin"], serde_json::json!([255, 0]));
    }

    #[test]
    fn headers_nested_past_the_limit_are_cut_at_the_limit() {
        // 5000 levels, built iteratively (a recursive build would need the depth it tests).
        let mut value = AMQPValue::LongString(LongString::from("leaf"));
        for _ in 0..5000 {
            let mut table = FieldTable::default();
            table.insert("n".into(), value);
            value = AMQPValue::FieldTable(table);
        }
        let mut table = FieldTable::default();
        table.insert("h".into(), value);
        let (map, too_deep) = headers_to_json(&table);
        assert!(too_deep);
        let mut json = &Value::Object(map);
        let mut depth = 0;
        while let Some(inner) = json.get("h").or_else(|| json.get("n")) {
            json = inner;
            depth += 1;
        }
        assert_eq!(json, &Value::String(TOO_DEEP.to_owned()));
        assert_eq!(depth, MAX_HEADER_DEPTH, "kept levels");
        // Dropping the 5000-level table is recursive too: leak it rather than overflow here.
        std::mem::forget(table);
    }
}
