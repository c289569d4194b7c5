//! `storage_class` and `retrieval_adapter`: the storage adapters the facade knows, in one table
//! of (names, Cargo feature, opener, own section and its display) with the search index each
//! pairs with. The core knows none of these names; a storage adapter is added here.

use std::path::PathBuf;
use std::sync::Arc;

use deermem_core::ConfigError;
use deermem_core::ports::Clock;
use deermem_updater::DeerMemConfig;
use serde_json::{Map, Value};

use super::{EmbeddedError, EmbeddedStorage};

/// The storage adapter `storage_class` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageClass {
    /// The file store (`''` or `file`).
    File,
    /// PostgreSQL (`postgres`).
    Postgres,
}

impl StorageClass {
    /// The config value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Postgres => "postgres",
        }
    }
}

/// Opens one storage adapter: configuration, storage root, clock, whether to open the search
/// index beside it, and the environment lookup (for `$VAR` references it resolves itself).
type Opener = fn(
    &DeerMemConfig,
    PathBuf,
    Arc<dyn Clock>,
    bool,
    &dyn Fn(&str) -> Option<String>,
) -> Result<EmbeddedStorage, EmbeddedError>;

/// Shows a storage adapter's own section of `backend_config`: parsed with the adapter's
/// settings type and serialised (its display form, which writes no secret); `None` when it
/// does not parse.
type ShowSection = fn(&Value) -> Option<Value>;

/// One storage adapter.
struct StorageEntry {
    class: StorageClass,
    /// The `storage_class` values that select it.
    names: &'static [&'static str],
    /// The Cargo feature of the `deermem` crate that compiles it in.
    feature: &'static str,
    /// Its opener, when it is compiled in.
    open: Option<Opener>,
    /// The key of its own section in `backend_config`, if it has one (read and checked by the
    /// adapter's own settings type), and its display when it is compiled in.
    section: Option<(&'static str, Option<ShowSection>)>,
    /// The `retrieval_adapter` used when none is set.
    default_retrieval: &'static str,
    /// A `retrieval_adapter` it cannot work with, and why.
    refused_retrieval: (&'static str, &'static str),
}

/// Every storage adapter, compiled in or not: the one place one is added.
const STORAGES: [StorageEntry; 2] = [
    StorageEntry {
        class: StorageClass::File,
        names: &["", "file"],
        feature: "storage-file",
        open: Some(open_file),
        // Its keys are DeerMem's own.
        section: None,
        default_retrieval: "fts5",
        refused_retrieval: (
            "postgres",
            "'postgres' searches the PostgreSQL storage; set storage_class: postgres too, or use 'fts5' with the file storage",
        ),
    },
    StorageEntry {
        class: StorageClass::Postgres,
        names: &["postgres"],
        feature: "storage-postgres",
        #[cfg(feature = "storage-postgres")]
        open: Some(open_postgres),
        #[cfg(not(feature = "storage-postgres"))]
        open: None,
        #[cfg(feature = "storage-postgres")]
        section: Some(("postgres", Some(show_postgres))),
        #[cfg(not(feature = "storage-postgres"))]
        section: Some(("postgres", None)),
        default_retrieval: "postgres",
        refused_retrieval: (
            "fts5",
            "'fts5' is an index on the local disk and cannot be shared by replicas; with storage_class: postgres use 'postgres' (the default) or '' (substring scan)",
        ),
    },
];

/// The keys of `backend_config` that are storage adapters' own sections, compiled in or not:
/// DeerMem's own settings leave them to the adapters.
pub(crate) fn storage_sections() -> Vec<&'static str> {
    STORAGES
        .iter()
        .filter_map(|e| e.section.map(|(key, _)| key))
        .collect()
}

/// The search indexes `retrieval_adapter` may name (`''`: none, substring scan).
const RETRIEVALS: [&str; 3] = ["", "fts5", "postgres"];

fn entry(storage_class: &str) -> Result<&'static StorageEntry, ConfigError> {
    STORAGES
        .iter()
        .find(|e| e.names.contains(&storage_class))
        .ok_or_else(|| {
            ConfigError::new(
                "memory.backend_config.storage_class",
                format!(
                    "{storage_class:?} is not available; this engine ships the file storage ('' or 'file') and PostgreSQL ('postgres'). Refusing to silently fall back because memory is persistent state"
                ),
            )
        })
}

/// The storage adapter `cfg` selects.
///
/// # Errors
/// `memory.backend_config.storage_class` naming no storage adapter.
pub fn storage_class(cfg: &DeerMemConfig) -> Result<StorageClass, ConfigError> {
    entry(&cfg.storage_class).map(|e| e.class)
}

/// Checks `storage_class` and `retrieval_adapter` of a parsed `backend_config` (`bc`, as
/// written) and sets the search index the storage uses when none is set: PostgreSQL's own with
/// PostgreSQL storage; the FTS5 index is a file beside the file store and PostgreSQL search
/// needs PostgreSQL storage, so the other pairings are refused.
///
/// # Errors
/// The offending key, `memory.backend_config.storage_class` or `…retrieval_adapter`.
pub(super) fn select(
    cfg: &mut DeerMemConfig,
    bc: &Map<String, Value>,
) -> Result<StorageClass, ConfigError> {
    let key = "memory.backend_config.retrieval_adapter";
    let e = entry(&cfg.storage_class)?;
    if !RETRIEVALS.contains(&cfg.retrieval_adapter.as_str()) {
        return Err(ConfigError::new(
            key,
            format!(
                "{:?} failed to load: only 'fts5', 'postgres' or '' (disabled) are available. Refusing to silently fall back",
                cfg.retrieval_adapter
            ),
        ));
    }
    if bc.get("retrieval_adapter").is_none_or(Value::is_null) {
        cfg.retrieval_adapter = e.default_retrieval.into();
    }
    let (refused, why) = e.refused_retrieval;
    if cfg.retrieval_adapter == refused {
        return Err(ConfigError::new(key, why));
    }
    Ok(e.class)
}

/// The storage adapter's section `key` of `backend_config` as shown: its display, `null` as
/// written, or `{"not_shown": ...}` when its adapter is not compiled in or it does not parse.
pub(super) fn shown_section(key: &str, section: &Value) -> Value {
    use crate::shown::{Why, not_shown};
    if section.is_null() {
        return Value::Null;
    }
    let show = STORAGES
        .iter()
        .find_map(|e| e.section.filter(|(k, _)| *k == key));
    match show {
        Some((_, Some(show))) => show(section).unwrap_or_else(|| not_shown(Why::Invalid)),
        Some((_, None)) => not_shown(Why::NotCompiled),
        None => not_shown(Why::Invalid),
    }
}

/// The `postgres` section's display: `PostgresConfig`'s, the URL `"***"`.
#[cfg(feature = "storage-postgres")]
fn show_postgres(section: &Value) -> Option<Value> {
    let settings = deermem_storage_postgres::PostgresConfig::from_section(section).ok()?;
    serde_json::to_value(settings).ok()
}

/// Opens the storage `cfg` selects, or fails naming the Cargo feature it needs.
pub(super) fn open(
    cfg: &DeerMemConfig,
    root: PathBuf,
    clock: Arc<dyn Clock>,
    with_retrieval: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EmbeddedStorage, EmbeddedError> {
    let e = entry(&cfg.storage_class)?;
    match e.open {
        Some(open) => open(cfg, root, clock, with_retrieval, env),
        None => Err(EmbeddedError::NotCompiled {
            storage: e.class.as_str(),
            feature: e.feature,
        }),
    }
}

fn open_file(
    cfg: &DeerMemConfig,
    root: PathBuf,
    clock: Arc<dyn Clock>,
    with_retrieval: bool,
    _env: &dyn Fn(&str) -> Option<String>,
) -> Result<EmbeddedStorage, EmbeddedError> {
    super::open_storage(cfg, root, clock, with_retrieval)
        .map(|s| EmbeddedStorage::File(Arc::new(s)))
}

/// PostgreSQL: its search is the database's own, so the storage root and `with_retrieval` do
/// not apply (with an embedder, search by meaning runs over the facts with their vectors in
/// the same database).
#[cfg(feature = "storage-postgres")]
fn open_postgres(
    cfg: &DeerMemConfig,
    _root: PathBuf,
    clock: Arc<dyn Clock>,
    _with_retrieval: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EmbeddedStorage, EmbeddedError> {
    super::postgres::open(cfg, clock, env).map(|s| EmbeddedStorage::Postgres(Arc::new(s)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<DeerMemConfig, ConfigError> {
        let bc = v.as_object().unwrap();
        let (mut c, _) = DeerMemConfig::from_backend_config_with_sections(bc, &["postgres"])?;
        select(&mut c, bc)?;
        Ok(c)
    }

    #[test]
    fn unknown_adapters_are_refused_naming_the_key() {
        for (key, value) in [
            ("retrieval_adapter", json!("my.module:factory")),
            ("storage_class", json!("pkg.Storage")),
        ] {
            let err = parse(json!({ key: value.clone() }))
                .expect_err(&format!("{key}={value} must fail"));
            assert_eq!(err.key, format!("memory.backend_config.{key}"), "{err}");
        }
    }

    #[test]
    fn postgres_selection() {
        let c = parse(json!({
            "storage_class": "postgres",
            "postgres": {"url": "postgres://u:pw@h/db", "pool_size": "4"},
        }))
        .unwrap();
        assert_eq!(storage_class(&c).unwrap(), StorageClass::Postgres);
        assert_eq!(
            c.retrieval_adapter, "postgres",
            "the default with postgres storage"
        );
        assert_eq!(
            c.storage_sections.get("postgres"),
            Some(&json!({"url": "postgres://u:pw@h/db", "pool_size": "4"})),
            "the adapter's section is kept as written, for the adapter to read"
        );
        let shown = serde_json::to_string(&c).unwrap();
        assert!(!shown.contains("pw@h"), "{shown}");
        let shown = shown_section("postgres", &c.storage_sections["postgres"]).to_string();
        assert!(!shown.contains("pw@h"), "{shown}");
        // The substring scan may still be chosen explicitly.
        let c = parse(json!({"storage_class": "postgres", "retrieval_adapter": ""})).unwrap();
        assert_eq!(c.retrieval_adapter, "");
        // Files keep the FTS5 default.
        assert_eq!(
            storage_class(&parse(json!({})).unwrap()).unwrap(),
            StorageClass::File
        );
        assert_eq!(parse(json!({})).unwrap().retrieval_adapter, "fts5");
        let refused = [
            json!({"storage_class": "postgres", "retrieval_adapter": "fts5"}),
            json!({"retrieval_adapter": "postgres"}),
        ];
        for v in refused {
            let err = parse(v.clone()).expect_err(&format!("{v} must fail"));
            assert_eq!(
                err.key, "memory.backend_config.retrieval_adapter",
                "{v}: {err}"
            );
        }
    }
}
