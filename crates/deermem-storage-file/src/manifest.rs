//! The per-user manifest (the version 2.0 JSON with the summaries and the manifest revision):
//! reading it strictly (unreadable means corrupt, never empty), its lenient revision, the legacy
//! checks, the cache signature, the compatibility document built from it, and the exact five-key v2
//! form the writer produces.

use std::path::{Path, PathBuf};

use deermem_core::document::DOCUMENT_VERSION;
use deermem_core::{MemoryDocument, SummarySection, Timestamp};
use deermem_pycompat::py;
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use deermem_pycompat::json;

/// A parsed manifest.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    pub(crate) path: PathBuf,
    pub(crate) map: Map<String, Value>,
    pub(crate) revision: u64,
}

/// The cache validation token: `(mtime_ns, size, revision)`, all `None` without a manifest.
pub(crate) type Signature = Option<(i128, u64, u64)>;

/// `int(value or 0)` as the reference reads the revision; negative or non-numeric values are
/// corruption.
fn lenient_revision(v: Option<&Value>) -> std::result::Result<u64, BadRevision> {
    let bad = |v: &Value| BadRevision(v.clone());
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Bool(b)) => Ok(u64::from(*b)),
        Some(Value::Number(n)) => {
            if let Some(u) = n.as_u64() {
                Ok(u)
            } else if let Some(f) = n.as_f64().filter(|f| f.is_finite() && *f >= 0.0) {
                // Python's int() truncates toward zero.
                Ok(f.trunc() as u64)
            } else {
                Err(bad(&Value::Number(n.clone())))
            }
        }
        Some(Value::String(s)) if s.is_empty() => Ok(0),
        Some(Value::String(s)) => {
            let t = py::strip(s).replace('_', "");
            t.strip_prefix('+')
                .unwrap_or(&t)
                .parse::<u64>()
                .map_err(|_| bad(&Value::String(s.clone())))
        }
        Some(other) if !py::truthy(other) => Ok(0),
        Some(other) => Err(bad(other)),
    }
}

/// A revision value that `int()` refuses (or a negative one).
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("has an invalid revision {0}")]
struct BadRevision(Value);

/// Parses manifest bytes.
///
/// # Errors
/// Corruption for invalid UTF-8 or JSON (including a BOM), a non-object, or a bad revision.
pub(crate) fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest> {
    let parse_err = |reason: String| Error::ManifestParse {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| parse_err(e.to_string()))?;
    let value = json::parse_lenient(text).map_err(|e| parse_err(e.to_string()))?;
    let Value::Object(map) = value else {
        return Err(Error::ManifestShape {
            path: path.to_path_buf(),
            reason: "is not an object".into(),
        });
    };
    let revision = lenient_revision(map.get("revision")).map_err(|bad| Error::ManifestShape {
        path: path.to_path_buf(),
        reason: bad.to_string(),
    })?;
    Ok(Manifest {
        path: path.to_path_buf(),
        map,
        revision,
    })
}

/// Reads the manifest, `None` when it does not exist.
///
/// # Errors
/// As [`parse_manifest`]; an unreadable file is corruption too.
pub(crate) fn read_manifest(path: &Path) -> Result<Option<Manifest>> {
    match crate::fsutil::read_optional(path) {
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => parse_manifest(path, &bytes).map(Some),
        Err(e) => Err(Error::ManifestParse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Reads the manifest together with its cache signature.
///
/// # Errors
/// As [`read_manifest`].
pub(crate) fn read_with_signature(path: &Path) -> Result<(Option<Manifest>, Signature)> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok((None, None));
        }
        Err(e) => {
            return Err(Error::ManifestParse {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let Some(manifest) = read_manifest(path)? else {
        return Ok((None, None));
    };
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128);
    let revision = manifest.revision;
    Ok((Some(manifest), Some((mtime_ns, meta.len(), revision))))
}

/// What a `stat` of the manifest says: enough to tell, without reading it, that the file is
/// still the one a cached document was read from (see [`StatToken::vouches_for`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatToken {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) mtime_ns: i128,
    pub(crate) ctime_ns: i128,
}

/// The time-stamp granularity assumed for files whose modification time has sub-millisecond
/// digits (ext4, xfs, btrfs, tmpfs: one kernel tick, at most 10 ms), with a wide margin.
pub(crate) const FINE_GRANULARITY: std::time::Duration = std::time::Duration::from_millis(50);
/// The granularity assumed otherwise (whole-second or 2-second time stamps: FAT, HFS+, ext3,
/// some network file systems).
pub(crate) const COARSE_GRANULARITY: std::time::Duration = std::time::Duration::from_secs(2);

impl StatToken {
    fn from_metadata(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }

    /// The granularity assumed for this file's time stamps.
    pub(crate) fn granularity(&self) -> std::time::Duration {
        if self.mtime_ns.rem_euclid(1_000_000) != 0 {
            FINE_GRANULARITY
        } else {
            COARSE_GRANULARITY
        }
    }

    /// Whether a cached document read from the file this token describes, with the `stat` taken
    /// at `observed_at` (wall clock, read before the `stat` call), is still current when the
    /// path now stats as `now`.
    ///
    /// Every writer replaces the manifest by renaming a fresh file over it, so a replacement
    /// prepared before `observed_at` has another inode (both files existed at once), and
    /// anything written after `observed_at` carries an mtime of at least `observed_at` minus
    /// the granularity, which differs from ours once ours is older than `observed_at` by more
    /// than the granularity. A token observed inside that window vouches for nothing: the
    /// caller re-reads the manifest and compares its revision, as the reference does.
    pub(crate) fn vouches_for(&self, now: &StatToken, observed_at: std::time::SystemTime) -> bool {
        if self != now {
            return false;
        }
        let observed_ns = match observed_at.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i128,
            Err(_) => return false,
        };
        observed_ns - self.mtime_ns >= self.granularity().as_nanos() as i128
            && observed_ns - self.ctime_ns >= self.granularity().as_nanos() as i128
    }
}

/// `stat`s the manifest: `Ok(None)` when it does not exist.
///
/// # Errors
/// Any other `stat` failure.
pub(crate) fn stat_token(path: &Path) -> std::io::Result<Option<StatToken>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(StatToken::from_metadata(&m))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

impl Manifest {
    /// Whether the manifest is legacy (v1 or v2-preview) and needs migration.
    pub(crate) fn needs_migration(&self) -> bool {
        self.map.get("version").and_then(Value::as_str) != Some(DOCUMENT_VERSION)
            || self.map.contains_key("facts")
    }

    /// The `version` value as text (`None` when absent), for migration reports.
    pub(crate) fn version_text(&self) -> Option<String> {
        self.map.get("version").and_then(py::py_str)
    }

    fn section(&self, key: &str, default: fn() -> SummarySection) -> Result<SummarySection> {
        match self.map.get(key) {
            None => Ok(default()),
            Some(Value::Object(m)) => Ok(SummarySection(m.clone())),
            Some(_) => Err(Error::ManifestShape {
                path: self.path.clone(),
                reason: format!("has a non-object {key:?} section"),
            }),
        }
    }

    /// The `user` section (defaults when absent).
    ///
    /// # Errors
    /// Corruption when the section is not an object.
    pub(crate) fn user(&self) -> Result<SummarySection> {
        self.section("user", SummarySection::default_user)
    }

    /// The `history` section (defaults when absent).
    ///
    /// # Errors
    /// Corruption when the section is not an object.
    pub(crate) fn history(&self) -> Result<SummarySection> {
        self.section("history", SummarySection::default_history)
    }

    /// `lastUpdated` as text.
    pub(crate) fn last_updated(&self) -> String {
        match self.map.get("lastUpdated") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => py::py_str(other).unwrap_or_else(|| other.to_string()),
        }
    }

    /// The version string reported in documents and results.
    pub(crate) fn version(&self) -> String {
        self.version_text().unwrap_or_default()
    }
}

/// The compatibility document of a manifest (or the empty template) with the given facts.
///
/// # Errors
/// Corruption for non-object summary sections.
pub(crate) fn document(
    manifest: Option<&Manifest>,
    facts: Vec<deermem_core::Fact>,
    now: Timestamp,
) -> Result<MemoryDocument> {
    let Some(m) = manifest else {
        let mut doc = MemoryDocument::empty(now);
        doc.facts = facts.into();
        return Ok(doc);
    };
    let extra = m
        .map
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "version" | "revision" | "lastUpdated" | "user" | "history" | "facts"
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(MemoryDocument {
        version: m.version(),
        revision: m.revision,
        last_updated: m.last_updated(),
        user: m.user()?,
        history: m.history()?,
        facts: facts.into(),
        extra,
    })
}

/// The exact v2 manifest text: five keys in the reference's order, Python JSON style.
pub(crate) fn render(
    revision: u64,
    last_updated: &str,
    user: &Map<String, Value>,
    history: &Map<String, Value>,
) -> String {
    json::to_python_json(&serde_json::json!({
        "version": DOCUMENT_VERSION,
        "revision": revision,
        "lastUpdated": last_updated,
        "user": user,
        "history": history,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn revision_is_read_leniently() {
        let cases = [
            (None, Some(0)),
            (Some(json!(null)), Some(0)),
            (Some(json!(3)), Some(3)),
            (Some(json!("3")), Some(3)),
            (Some(json!(2.7)), Some(2)),
            (Some(json!(true)), Some(1)),
            (Some(json!("")), Some(0)),
            (Some(json!("abc")), None),
            (Some(json!(-1)), None),
            (Some(json!([1])), None),
            (Some(json!([])), Some(0)),
        ];
        for (v, want) in cases {
            assert_eq!(lenient_revision(v.as_ref()).ok(), want, "{v:?}");
        }
    }

    #[test]
    fn stat_tokens_vouch_only_outside_the_granularity_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("memory.json");
        assert_eq!(stat_token(&path).unwrap(), None);
        std::fs::write(&path, b"{}").unwrap();
        let t = stat_token(&path).unwrap().unwrap();
        let mtime = std::time::UNIX_EPOCH
            + std::time::Duration::from_nanos(t.mtime_ns.max(t.ctime_ns) as u64);
        let g = t.granularity();
        // Observed right at the write: inside the window, so it vouches for nothing.
        assert!(!t.vouches_for(&t, mtime));
        // Observed well after: vouches for an identical stat, never for a different one.
        let later = mtime + g + std::time::Duration::from_millis(1);
        assert!(t.vouches_for(&t, later));
        let replaced = StatToken {
            ino: t.ino + 1,
            ..t
        };
        assert!(!t.vouches_for(&replaced, later));
        let grown = StatToken {
            size: t.size + 1,
            ..t
        };
        assert!(!t.vouches_for(&grown, later));
        // Whole-millisecond time stamps are treated as coarse (2 s).
        let coarse = StatToken {
            mtime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 1_700_000_000_000_000_000,
            ..t
        };
        assert_eq!(coarse.granularity(), COARSE_GRANULARITY);
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_001_000_000_000);
        assert!(!coarse.vouches_for(&coarse, at));
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_002_000_000_000);
        assert!(coarse.vouches_for(&coarse, at));
    }

    #[test]
    fn legacy_detection_and_rendering() {
        let p = Path::new("/m.json");
        let v1 = parse_manifest(p, br#"{"version": "1.0", "facts": []}"#).unwrap();
        assert!(v1.needs_migration());
        let num = parse_manifest(p, br#"{"version": 2.0}"#).unwrap();
        assert!(num.needs_migration());
        let text = render(
            1,
            "2026-01-01T00:00:00Z",
            SummarySection::default_user().as_map(),
            SummarySection::default_history().as_map(),
        );
        let v2 = parse_manifest(p, text.as_bytes()).unwrap();
        assert!(!v2.needs_migration());
        assert_eq!(v2.revision, 1);
        assert!(
            text.starts_with("{\n  \"version\": \"2.0\",\n  \"revision\": 1,\n  \"lastUpdated\"")
        );
        assert!(!text.ends_with('\n'));
        assert!(matches!(
            parse_manifest(p, b"{broken"),
            Err(Error::ManifestParse { .. })
        ));
        assert!(matches!(
            parse_manifest(p, b"[]"),
            Err(Error::ManifestShape { .. })
        ));
        assert!(parse_manifest(p, "\u{feff}{}".as_bytes()).is_err());
    }
}
