//! Where Python's `json.loads` (CPython 3.12's scanner, the reference's) reports a syntax
//! error, and with which message: the `loc` (`["body", <position>]`, in code points) and
//! `ctx.error` of FastAPI's `json_invalid` item. Only called once serde_json has refused a
//! body, so speed does not matter; the scan is the grammar Python's decoder applies, with its
//! error positions.

/// A decode error as Python's `JSONDecodeError` gives it: `pos` (code points from the start
/// of the text) and `msg` (without the line and column suffix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PyJsonError {
    /// Position in code points.
    pub(crate) pos: usize,
    /// Python's message.
    pub(crate) msg: &'static str,
}

/// Deeper nesting than this is not scanned (serde_json refuses it long before).
const MAX_DEPTH: usize = 512;

enum Scan {
    /// A value ended just before this position.
    Ok(usize),
    /// Python raised `StopIteration(pos)`: no value starts here ("Expecting value").
    NoValue(usize),
    /// A `JSONDecodeError`.
    Error(PyJsonError),
    /// Too deep to scan.
    TooDeep,
}

struct Scanner {
    s: Vec<char>,
}

fn err(pos: usize, msg: &'static str) -> Scan {
    Scan::Error(PyJsonError { pos, msg })
}

impl Scanner {
    fn at(&self, i: usize) -> Option<char> {
        self.s.get(i).copied()
    }

    fn skip_ws(&self, mut i: usize) -> usize {
        while matches!(self.at(i), Some(' ' | '\t' | '\n' | '\r')) {
            i += 1;
        }
        i
    }

    fn starts_with(&self, i: usize, word: &str) -> bool {
        word.chars()
            .enumerate()
            .all(|(k, c)| self.at(i + k) == Some(c))
    }

    fn value(&self, i: usize, depth: usize) -> Scan {
        if depth > MAX_DEPTH {
            return Scan::TooDeep;
        }
        let Some(c) = self.at(i) else {
            return Scan::NoValue(i);
        };
        match c {
            '"' => self.string(i + 1),
            '{' => self.object(i + 1, depth + 1),
            '[' => self.array(i + 1, depth + 1),
            'n' if self.starts_with(i, "null") => Scan::Ok(i + 4),
            't' if self.starts_with(i, "true") => Scan::Ok(i + 4),
            'f' if self.starts_with(i, "false") => Scan::Ok(i + 5),
            'N' if self.starts_with(i, "NaN") => Scan::Ok(i + 3),
            'I' if self.starts_with(i, "Infinity") => Scan::Ok(i + 8),
            '-' if self.starts_with(i, "-Infinity") => Scan::Ok(i + 9),
            _ => self.number(i),
        }
    }

    fn is_digit(&self, i: usize) -> bool {
        self.at(i).is_some_and(|c| c.is_ascii_digit())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, the longest match.
    fn number(&self, start: usize) -> Scan {
        let mut i = start;
        if self.at(i) == Some('-') {
            i += 1;
        }
        match self.at(i) {
            Some('1'..='9') => {
                i += 1;
                while self.is_digit(i) {
                    i += 1;
                }
            }
            Some('0') => i += 1,
            _ => return Scan::NoValue(start),
        }
        if self.at(i) == Some('.') && self.is_digit(i + 1) {
            i += 2;
            while self.is_digit(i) {
                i += 1;
            }
        }
        if matches!(self.at(i), Some('e' | 'E')) {
            let mut j = i + 1;
            if matches!(self.at(j), Some('+' | '-')) {
                j += 1;
            }
            if self.is_digit(j) {
                while self.is_digit(j) {
                    j += 1;
                }
                i = j;
            }
        }
        Scan::Ok(i)
    }

    /// A string whose opening quote is at `start - 1`.
    fn string(&self, start: usize) -> Scan {
        let begin = start - 1;
        let len = self.s.len();
        let mut end = start;
        loop {
            let mut next = end;
            while next < len {
                let d = self.s[next];
                if d == '"' || d == '\\' {
                    break;
                }
                if u32::from(d) <= 0x1f {
                    return err(next, "Invalid control character at");
                }
                next += 1;
            }
            if next >= len {
                return err(begin, "Unterminated string starting at");
            }
            if self.s[next] == '"' {
                return Scan::Ok(next + 1);
            }
            // A backslash at `next`.
            let esc = next + 1;
            let Some(c) = self.at(esc) else {
                return err(begin, "Unterminated string starting at");
            };
            if c != 'u' {
                if !matches!(c, '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't') {
                    return err(next, "Invalid \\escape");
                }
                end = esc + 1;
                continue;
            }
            let hex = esc + 1;
            end = hex + 4;
            if end >= len {
                return err(esc, "Invalid \\uXXXX escape");
            }
            let Some(unit) = self.hex4(hex) else {
                return err(esc, "Invalid \\uXXXX escape");
            };
            // A high surrogate followed by `\u`: the second escape must be four hex digits too.
            if (0xD800..=0xDBFF).contains(&unit)
                && end + 6 < len
                && self.s[end] == '\\'
                && self.s[end + 1] == 'u'
            {
                if self.hex4(end + 2).is_none() {
                    return err(end + 1, "Invalid \\uXXXX escape");
                }
                end += 6;
            }
        }
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let mut v = 0;
        for k in 0..4 {
            v = v * 16 + self.at(i + k)?.to_digit(16)?;
        }
        Some(v)
    }

    /// An object whose `{` is at `start - 1`.
    fn object(&self, start: usize, depth: usize) -> Scan {
        let mut i = self.skip_ws(start);
        if self.at(i) == Some('}') {
            return Scan::Ok(i + 1);
        }
        loop {
            if self.at(i) != Some('"') {
                return err(i, "Expecting property name enclosed in double quotes");
            }
            i = match self.string(i + 1) {
                Scan::Ok(n) => n,
                other => return other,
            };
            i = self.skip_ws(i);
            if self.at(i) != Some(':') {
                return err(i, "Expecting ':' delimiter");
            }
            i = self.skip_ws(i + 1);
            i = match self.value(i, depth) {
                Scan::Ok(n) => n,
                other => return other,
            };
            i = self.skip_ws(i);
            match self.at(i) {
                Some('}') => return Scan::Ok(i + 1),
                Some(',') => i = self.skip_ws(i + 1),
                _ => return err(i, "Expecting ',' delimiter"),
            }
        }
    }

    /// An array whose `[` is at `start - 1`.
    fn array(&self, start: usize, depth: usize) -> Scan {
        let mut i = self.skip_ws(start);
        if self.at(i) == Some(']') {
            return Scan::Ok(i + 1);
        }
        loop {
            i = match self.value(i, depth) {
                Scan::Ok(n) => n,
                other => return other,
            };
            i = self.skip_ws(i);
            match self.at(i) {
                Some(']') => return Scan::Ok(i + 1),
                Some(',') => i = self.skip_ws(i + 1),
                _ => return err(i, "Expecting ',' delimiter"),
            }
        }
    }
}

/// The error `json.loads(text)` raises, or `None` when Python would accept the text (its
/// `NaN`/`Infinity` literals, lone surrogate escapes) or it is nested too deep to scan.
pub(crate) fn python_decode_error(text: &str) -> Option<PyJsonError> {
    let sc = Scanner {
        s: text.chars().collect(),
    };
    let start = sc.skip_ws(0);
    match sc.value(start, 0) {
        Scan::Ok(end) => {
            let end = sc.skip_ws(end);
            (end != sc.s.len()).then_some(PyJsonError {
                pos: end,
                msg: "Extra data",
            })
        }
        Scan::NoValue(pos) => Some(PyJsonError {
            pos,
            msg: "Expecting value",
        }),
        Scan::Error(e) => Some(e),
        Scan::TooDeep => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed with CPython 3.11 (whose scanner is 3.12's): `json.loads(s)` raises
    /// `JSONDecodeError` with these `pos` and `msg`.
    #[test]
    fn positions_and_messages_are_pythons() {
        let cases: &[(&str, Option<(usize, &str)>)] = &[
            ("", Some((0, "Expecting value"))),
            ("   ", Some((3, "Expecting value"))),
            ("x", Some((0, "Expecting value"))),
            (
                "{x",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            (
                "{",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            ("{\"a\" 1}", Some((5, "Expecting ':' delimiter"))),
            ("{\"a\":}", Some((5, "Expecting value"))),
            (
                "{\"a\":1,}",
                Some((7, "Expecting property name enclosed in double quotes")),
            ),
            ("{\"a\":1 \"b\":2}", Some((7, "Expecting ',' delimiter"))),
            ("[1,]", Some((3, "Expecting value"))),
            ("[1 2]", Some((3, "Expecting ',' delimiter"))),
            ("[", Some((1, "Expecting value"))),
            ("{\"a\": tru}", Some((6, "Expecting value"))),
            ("{\"content\": \"x\"} y", Some((17, "Extra data"))),
            ("01", Some((1, "Extra data"))),
            ("-", Some((0, "Expecting value"))),
            ("1.", Some((1, "Extra data"))),
            ("1e", Some((1, "Extra data"))),
            ("\"abc", Some((0, "Unterminated string starting at"))),
            (
                "{\"a\": \"x\ny\"}",
                Some((8, "Invalid control character at")),
            ),
            ("\"\\x\"", Some((1, "Invalid \\escape"))),
            ("\"\\u12\"", Some((2, "Invalid \\uXXXX escape"))),
            ("\"\\u12G4\"", Some((2, "Invalid \\uXXXX escape"))),
            ("\"\\ud800\\u12G4\"", Some((8, "Invalid \\uXXXX escape"))),
            ("\"\\", Some((0, "Unterminated string starting at"))),
            ("{\"é\": x}", Some((6, "Expecting value"))),
            (
                "{'a': 1}",
                Some((1, "Expecting property name enclosed in double quotes")),
            ),
            ("\u{feff}{}", Some((0, "Expecting value"))),
            ("\"\\u0041", Some((2, "Invalid \\uXXXX escape"))),
            ("[1,2,", Some((5, "Expecting value"))),
            ("{\"a\":\"\\ud800\\x\"}", Some((12, "Invalid \\escape"))),
            ("{\"a\"", Some((4, "Expecting ':' delimiter"))),
            ("[-", Some((1, "Expecting value"))),
            ("[1e+]", Some((2, "Expecting ',' delimiter"))),
            ("nul", Some((0, "Expecting value"))),
            ("\"a\\u00\"", Some((3, "Invalid \\uXXXX escape"))),
            ("[NaN, Infinity, -Infinity]", None),
            ("\"\\ud800\"", None),
            (
                "{\"a\": [1, 2.5e-3, true, false, null, \"\\u00e9\\n\"]}",
                None,
            ),
        ];
        for (text, want) in cases {
            let got = python_decode_error(text).map(|e| (e.pos, e.msg));
            assert_eq!(got, want.map(|(p, m)| (p, m)), "{text:?}");
        }
    }

    #[test]
    fn deep_nesting_is_not_scanned() {
        assert_eq!(python_decode_error(&"[".repeat(5000)), None);
    }
}
