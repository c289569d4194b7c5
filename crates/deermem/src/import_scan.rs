//! The pre-parse guard of import text: the number of facts a raw JSON import document holds,
//! counted by scanning the text, so an oversized document (more than
//! [`deermem_core::MAX_IMPORT_FACTS`] facts) costs a scan, not thousands of parsed and
//! normalised facts. Used by the gateway's body extractor and the CLI's `import`.

use std::cell::Cell;
use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The number of items of the top-level `facts` list of a JSON import document, counted while
/// scanning the text (no fact is built). With several `facts` keys, the longest list counts.
///
/// Items are counted as they are scanned, so a list followed by a syntax error (or cut off)
/// still reports the items seen before it. `None` when no top-level `facts` list was seen
/// (not an object, no such key, or text that does not parse before one): the caller's full
/// decoder then reports that with its own messages. A leading UTF-8 BOM is skipped.
pub fn import_fact_count(json: &[u8]) -> Option<usize> {
    let json = json.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(json);
    let most = Cell::new(None);
    let mut de = serde_json::Deserializer::from_slice(json);
    // A parse error ends the scan; what was counted before it stands.
    let _ = de.deserialize_map(TopLevel(&most));
    most.get()
}

/// Visits the top-level object, counting each `facts` list and skipping everything else; the
/// longest count so far is kept in the cell.
struct TopLevel<'a>(&'a Cell<Option<usize>>);

impl<'de> Visitor<'de> for TopLevel<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a memory document object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<KeyName>()? {
            if key.0 {
                map.next_value_seed(CountSeed(self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// A key of the top-level object: whether it is `facts` (the key text is not kept).
struct KeyName(bool);

impl<'de> de::Deserialize<'de> for KeyName {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyName, E> {
                Ok(KeyName(v == "facts"))
            }
        }
        d.deserialize_str(V)
    }
}

/// Counts the items of a list into the cell without building them; any other value is skipped.
struct CountSeed<'a>(&'a Cell<Option<usize>>);

impl<'de> de::DeserializeSeed<'de> for CountSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CountSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut n = 0usize;
        self.note(0);
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
            self.note(n);
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

impl CountSeed<'_> {
    fn note(&self, n: usize) {
        let most = self.0.get().map_or(n, |m| m.max(n));
        self.0.set(Some(most));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_top_level_facts_list_without_building_it() {
        let doc = |n: usize| {
            let facts: Vec<String> = (0..n)
                .map(|i| format!(r#"{{"id":"f{i}","content":"x","topics":[1,[2]]}}"#))
                .collect();
            format!(
                r#"{{"version":"2.0","user":{{"facts":[1,2,3]}},"facts":[{}]}}"#,
                facts.join(",")
            )
        };
        assert_eq!(import_fact_count(doc(0).as_bytes()), Some(0));
        assert_eq!(import_fact_count(doc(3).as_bytes()), Some(3));
        assert_eq!(import_fact_count(doc(60_000).as_bytes()), Some(60_000));
        let bom = format!("\u{feff}{}", doc(2));
        assert_eq!(import_fact_count(bom.as_bytes()), Some(2));
        // Duplicate keys: the longest list counts (whichever a decoder keeps).
        assert_eq!(
            import_fact_count(br#"{"facts":[1,2,3],"facts":[1]}"#),
            Some(3)
        );
    }

    #[test]
    fn anything_else_is_left_to_the_full_decoder() {
        for text in [
            &b"[1,2]"[..],
            b"{}",
            b"{\"facts\": {}}",
            b"{\"facts\": 5}",
            b"not json",
            b"",
            b"null",
        ] {
            assert_eq!(
                import_fact_count(text),
                None,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        // Items seen before a syntax error still count; skipping is not limited in depth.
        assert_eq!(import_fact_count(b"{\"facts\": [1, 2"), Some(2));
        let deep = format!(
            r#"{{"facts":[1,2,{}1{}]}}"#,
            "[".repeat(500),
            "]".repeat(500)
        );
        assert_eq!(import_fact_count(deep.as_bytes()), Some(3));
    }
}
