//! The fuzz target bodies. Each takes arbitrary bytes and panics only when it finds a bug: a
//! panic inside the code under test, a broken round trip, an untyped or 5xx failure, or a file
//! touched outside the scope it belongs to. `fuzz/fuzz_targets/*.rs` call these under
//! libFuzzer; the `reliability` tests feed them the seed corpora in `fuzz/corpus/<target>/` and
//! generated inputs, so every crash found becomes a regression test by adding its input there.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request};
use deermem_core::ports::MemoryStorageExt;
use deermem_core::ports::{Clock, Retrieval};
use deermem_core::prelude::*;
use deermem_core::{
    AgentName, Fact, MemoryConfig, Scope, SearchQuery, StorageError, Timestamp, UserId,
};
use deermem_gateway::{GatewayConfig, GatewayState};
use deermem_retrieval_fts5::Fts5Retrieval;
use deermem_storage_file::{FileStorage, probe};
use deermem_updater::DeerMemConfig;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

/// The names of the fuzz targets, as in `fuzz/fuzz_targets/<name>.rs` and
/// `fuzz/corpus/<name>/`.
pub const TARGETS: [&str; 8] = [
    "fact_markdown",
    "yaml_codec",
    "manifest_json",
    "sidecar_json",
    "journal_json",
    "llm_response",
    "gateway_body",
    "fts_query",
];

/// Runs the named target body on `data`.
///
/// # Panics
/// When the body finds a bug, or for an unknown target name.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "fact_markdown" => fact_markdown(data),
        "yaml_codec" => yaml_codec(data),
        "manifest_json" => manifest_json(data),
        "sidecar_json" => sidecar_json(data),
        "journal_json" => journal_json(data),
        "llm_response" => llm_response(data),
        "gateway_body" => gateway_body(data),
        "fts_query" => fts_query(data),
        other => panic!("unknown fuzz target {other}"),
    }
}

fn now() -> Timestamp {
    Timestamp::from_unix_seconds(1_800_000_000)
}

#[derive(Debug)]
struct FixedClock;

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        now()
    }
}

fn alice() -> UserId {
    UserId::new("alice").unwrap_or_else(|_| unreachable!("valid user id"))
}

fn agent_a() -> AgentName {
    AgentName::parse("agent-a").unwrap_or_else(|_| unreachable!("valid agent name"))
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("fuzz runtime: {e}"))
    })
}

/// The fact Markdown and front-matter parser: anything either fails typed or yields a fact that
/// renders to Markdown which parses back to the same fact.
pub fn fact_markdown(data: &[u8]) {
    let (u, a) = (alice(), agent_a());
    let Ok(fact) = probe::parse_fact_file(data, "f1", Some(&u), &a, now()) else {
        return;
    };
    check_fact_round_trip(&fact, &u, &a);
}

fn check_fact_round_trip(fact: &Fact, u: &UserId, a: &AgentName) {
    let text = deermem_storage_file::render_fact_markdown(fact)
        .unwrap_or_else(|e| panic!("a parsed fact does not render: {e}: {fact:?}"));
    let back = probe::parse_fact_file(text.as_bytes(), fact.id.as_str(), Some(u), a, now())
        .unwrap_or_else(|e| panic!("a rendered fact does not parse: {e}\n{text}"));
    assert_eq!(
        &back, fact,
        "render/parse round trip changed the fact\n{text}"
    );
}

/// The YAML 1.1 codec of `deermem-pycompat` on its own: typed errors only, whole documents of
/// any shape included; whenever the fast path answers, it equals the full reader; a parsed
/// mapping renders to YAML that parses back to the same mapping.
pub fn yaml_codec(data: &[u8]) {
    use deermem_pycompat::yaml;
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = yaml::parse_document(text);
    let full = yaml::parse_front_matter_full(text);
    if let Some(fast) = yaml::parse_front_matter_fast(text) {
        assert_eq!(Ok(&fast), full.as_ref(), "the fast path disagrees\n{text}");
    }
    let Ok(front) = full else {
        return;
    };
    let rendered = yaml::render_mapping(&front.map)
        .unwrap_or_else(|e| panic!("a parsed mapping does not render: {e}\n{text}"));
    let back = yaml::parse_mapping(&rendered)
        .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{rendered}"));
    assert_eq!(
        back, front.map,
        "render/parse round trip changed the mapping\n{rendered}"
    );
}

/// The manifest reader and the lenient JSON reader behind every JSON file of the store:
/// typed errors only, and the Python-style writer's output reads back to the same value.
pub fn manifest_json(data: &[u8]) {
    if let Ok(doc) = probe::parse_manifest(data, now()) {
        let public = doc.to_public();
        if let Err(e) = serde_json::to_string(&public) {
            panic!("a parsed manifest does not serialise: {e}");
        }
    }
    json_round_trip(data);
}

fn json_round_trip(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(value) = deermem_pycompat::json::parse_lenient(text) else {
        return;
    };
    let written = deermem_pycompat::json::to_python_json(&value);
    let again = deermem_pycompat::json::parse_lenient(&written)
        .unwrap_or_else(|e| panic!("our own JSON does not read back: {e}\n{written}"));
    assert!(
        deermem_pycompat::py::py_eq(&again, &value),
        "JSON round trip changed the value\n{written}"
    );
}

/// A scratch storage root reused by the filesystem-backed targets.
struct Scratch {
    _dir: tempfile::TempDir,
    root: PathBuf,
    storage: FileStorage,
}

fn scratch(slot: &'static OnceLock<Mutex<Scratch>>) -> std::sync::MutexGuard<'static, Scratch> {
    let m = slot.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let root = dir.path().join("root");
        let storage = deermem::embedded::open_storage(
            &DeerMemConfig::default(),
            root.clone(),
            Arc::new(FixedClock),
            false,
        )
        .unwrap_or_else(|e| panic!("storage: {e}"));
        Mutex::new(Scratch {
            _dir: dir,
            root,
            storage,
        })
    });
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn seed_fact(s: &Scratch) {
    let (u, a) = (alice(), agent_a());
    let id = deermem_core::FactId::new("keep").unwrap_or_else(|e| panic!("seed id: {e}"));
    let d = deermem_core::FactDraft::identified(id, "a fact that must survive")
        .unwrap_or_else(|e| panic!("seed draft: {e}"));
    if let Err(e) = runtime().block_on(s.storage.upsert_fact(Some(&u), &a, d, None, None)) {
        // Already there from an earlier input.
        assert!(e.is_conflict(), "seeding the scratch root failed: {e}");
    }
}

/// The usage sidecar: whatever its bytes, reading usage never fails for content (the reader is
/// tolerant by contract) and never touches the facts.
pub fn sidecar_json(data: &[u8]) {
    static SLOT: OnceLock<Mutex<Scratch>> = OnceLock::new();
    let s = scratch(&SLOT);
    seed_fact(&s);
    let (u, a) = (alice(), agent_a());
    let meta = s.root.join("users/alice/agents/agent-a/.metadata");
    std::fs::create_dir_all(&meta).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(meta.join("fact-usage.json"), data).unwrap_or_else(|e| panic!("write: {e}"));
    let usage = runtime().block_on(s.storage.get_fact_usage(Some(&u), &a));
    if let Err(e) = usage {
        panic!("a malformed usage sidecar must read as empty, not fail: {e}");
    }
    let rt = runtime();
    let id = deermem_core::FactId::new("keep").unwrap_or_else(|_| unreachable!("valid id"));
    if let Err(e) =
        rt.block_on(
            s.storage
                .record_fact_accesses(Some(&u), &a, std::slice::from_ref(&id), None),
        )
    {
        panic!("recording an access over a malformed sidecar failed: {e}");
    }
    let kept = rt.block_on(s.storage.get_fact(Some(&u), &a, &id));
    assert!(matches!(kept, Ok(Some(_))), "the fact was lost: {kept:?}");
}

/// The operation journal read by crash recovery: any bytes either recover (roll back or clean
/// up) or block the user with a typed corruption error; recovery never writes or deletes
/// anything outside the user's directory, whatever paths the journal names.
pub fn journal_json(data: &[u8]) {
    static SLOT: OnceLock<Mutex<Scratch>> = OnceLock::new();
    let s = scratch(&SLOT);
    seed_fact(&s);
    let (u, a) = (alice(), agent_a());
    // A decoy next to the user directory and one outside the root: recovery must not touch
    // either.
    let bob = s.root.join("users/bob/agents/agent-a/facts/00");
    std::fs::create_dir_all(&bob).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(bob.join("victim.md"), b"bob's").unwrap_or_else(|e| panic!("write: {e}"));
    let outside = s.root.parent().map(Path::to_path_buf).unwrap_or_default();
    std::fs::write(outside.join("victim.md"), b"outside").unwrap_or_else(|e| panic!("write: {e}"));
    let before_outside = crate::verify::files(&outside)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("root/users/alice"))
        .collect::<Vec<_>>();
    let udir = s.root.join("users/alice");
    std::fs::write(udir.join(".memory.journal.json"), data)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let loaded = runtime().block_on(s.storage.load(Some(&u), Some(&a)));
    match loaded {
        Ok(_) | Err(StorageError::Corrupt { .. }) | Err(StorageError::Io { .. }) => {}
        Err(e) => panic!("journal recovery failed with an unexpected error kind: {e:?}"),
    }
    let after_outside = crate::verify::files(&outside)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("root/users/alice"))
        .collect::<Vec<_>>();
    assert_eq!(
        before_outside, after_outside,
        "recovery changed files outside the user's directory"
    );
    // Reset: an operator would repair a blocked journal by removing it.
    let _ = std::fs::remove_file(udir.join(".memory.journal.json"));
}

/// The LLM response parser: typed errors only.
pub fn llm_response(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = deermem_updater::parse_update_response(&text);
}

fn gateway() -> &'static (Router, tempfile::TempDir) {
    static APP: OnceLock<(Router, tempfile::TempDir)> = OnceLock::new();
    APP.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let env = |_: &str| None;
        let mut opts = deermem::BuildOptions::new(&env);
        opts.storage_path = Some(dir.path().to_path_buf());
        opts.clock = Some(Arc::new(FixedClock));
        let manager = runtime()
            .block_on(async { deermem::build_manager(&MemoryConfig::default(), opts) })
            .unwrap_or_else(|e| panic!("manager: {e}"));
        let state = GatewayState::new(manager, MemoryConfig::default(), GatewayConfig::default());
        state.mark_ready();
        (deermem_gateway::router(state), dir)
    })
}

/// The gateway's request bodies and path/query parameters: the first byte picks a route, the
/// rest is the body (or the parameter). Every answer is a JSON error or success, never a 5xx.
pub fn gateway_body(data: &[u8]) {
    let (app, _) = gateway();
    let (sel, rest) = data.split_first().map_or((0, &[][..]), |(s, r)| (*s, r));
    let param: String = rest.iter().map(|b| format!("%{b:02X}")).collect::<String>();
    let (method, uri, body) = match sel % 7 {
        0 => (Method::POST, "/api/memory/facts".to_owned(), rest.to_vec()),
        1 => (
            Method::PATCH,
            "/api/memory/facts/f1".to_owned(),
            rest.to_vec(),
        ),
        2 => (Method::POST, "/api/memory/import".to_owned(), rest.to_vec()),
        3 => (
            Method::POST,
            "/api/memory/messages".to_owned(),
            rest.to_vec(),
        ),
        4 => (
            Method::DELETE,
            format!("/api/memory/facts/{param}"),
            Vec::new(),
        ),
        5 => (
            Method::GET,
            format!("/api/memory/search?q={param}"),
            Vec::new(),
        ),
        _ => (
            Method::GET,
            format!("/api/memory?agent={param}"),
            Vec::new(),
        ),
    };
    let request = Request::builder()
        .method(method)
        .uri(&uri)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Body::from(body));
    let Ok(request) = request else {
        return;
    };
    let (status, bytes, location) = runtime().block_on(async {
        let resp = app
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|e| match e {});
        let status = resp.status();
        let location = resp
            .headers()
            .get(axum::http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        (status, bytes, location)
    });
    assert!(
        !status.is_server_error(),
        "{uri} answered {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    if status.is_redirection() {
        // FastAPI's trailing-slash rule: an empty id leaves `/api/memory/facts/`, which is
        // redirected to the route without the slash; the answer names a same-origin path.
        let location = location.unwrap_or_default();
        assert!(
            location.starts_with('/') && !location.starts_with("//"),
            "{uri} answered {status} with Location {location:?}"
        );
    } else if !status.is_success() {
        let v: Result<serde_json::Value, _> = serde_json::from_slice(&bytes);
        assert!(
            v.is_ok_and(|v| v.get("detail").is_some()),
            "{uri} answered {status} without a JSON detail: {}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

fn fts() -> &'static Fts5Retrieval {
    static INDEX: OnceLock<Fts5Retrieval> = OnceLock::new();
    INDEX.get_or_init(|| {
        let r =
            Fts5Retrieval::in_memory(Arc::new(FixedClock)).unwrap_or_else(|e| panic!("index: {e}"));
        let scope = Scope::agent(&alice(), &agent_a());
        for (i, text) in [
            "Likes oolong tea 乌龙茶",
            "Lives in 東京 and speaks 日本語",
            "Writes Rust at work; \"quotes\" AND OR NOT NEAR(a b) * ^ : -",
            "Plays chess on Sundays",
        ]
        .iter()
        .enumerate()
        {
            let d = deermem_core::FactId::new(format!("q{i}"))
                .map_err(|e| e.to_string())
                .and_then(|id| {
                    deermem_core::FactDraft::identified(id, text).map_err(|e| e.to_string())
                })
                .unwrap_or_else(|e| panic!("seed draft: {e}"));
            let ctx = deermem_core::fact::NormalizeContext {
                scope: &scope.to_fact_scope(),
                existing: None,
                now: now(),
                new_id: &|| deermem_core::FactId::new("unused").unwrap_or_else(|_| unreachable!()),
            };
            let fact = deermem_core::fact::normalize_fact(&d, &ctx)
                .unwrap_or_else(|e| panic!("seed fact: {e}"));
            runtime()
                .block_on(r.upsert(&scope, &fact))
                .unwrap_or_else(|e| panic!("seed index: {e}"));
        }
        r
    })
}

/// FTS query sanitisation: any text searches without an error (the adapter's contract: no
/// query text is an error) and the query planner never panics.
pub fn fts_query(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = deermem_retrieval_fts5::query::plan(&text, &deermem_retrieval_fts5::query::NoSegmenter);
    let q = SearchQuery::new(text.as_ref(), Scope::agent(&alice(), &agent_a()), 5);
    if let Err(e) = fts().search_blocking(&q) {
        panic!("query {text:?} failed: {e}");
    }
}
