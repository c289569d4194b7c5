//! The DeerFlow frontend's memory page against `deermem serve` on files and on PostgreSQL: the
//! same sequence of requests the page and its settings make (read, create, edit, delete,
//! duplicate refusal, search, export, import, reload, status, context, clear) gets the same
//! status codes and, once fact ids and timestamps are named by role, the same bodies from both.
//! Where the answers may differ by design (the storage keys of `/api/memory/config` and
//! `/status`, BM25 scores, the order of equal-ranked hits) the test says so and compares the
//! rest.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use deermem_testkit::pgcluster::PgCluster;
use reqwest::Method;
use serde_json::{Value, json};

use crate::replicas::{Replica, http, send};

const USER: &str = "shared0";

/// A config for `storage` (`file`, or `postgres` on `$DEERMEM_TEST_DB`) with a token for USER.
fn write_config(dir: &Path, storage: &str) -> PathBuf {
    let store = match storage {
        "postgres" => {
            "    storage_class: postgres\n    postgres:\n      url: $DEERMEM_TEST_DB\n      schema: frontend_parity\n"
        }
        _ => "",
    };
    let path = dir.join(format!("{storage}.yaml"));
    std::fs::write(
        &path,
        format!(
            "memory:\n  backend_config:\n{store}    max_facts: 100\n    debounce_seconds: 300\n\
             gateway:\n  auth:\n    mode: token\n    tokens:\n      {}: {USER}\n",
            crate::replicas::token(USER)
        ),
    )
    .expect("config written");
    path
}

/// Names fact ids by the content they were created with and timestamps by their shape, so two
/// servers' answers compare equal when they mean the same.
#[derive(Default)]
struct Names {
    ids: BTreeMap<String, String>,
}

impl Names {
    /// Learns the ids of `doc`'s facts that are not named yet, by their content.
    fn learn(&mut self, doc: &Value) {
        for f in doc["facts"].as_array().into_iter().flatten() {
            if let (Some(id), Some(content)) = (f["id"].as_str(), f["content"].as_str()) {
                self.ids
                    .entry(id.to_owned())
                    .or_insert_with(|| format!("<fact: {content}>"));
            }
        }
    }

    fn normalise(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => {
                if let Some(name) = self.ids.get(s) {
                    return json!(name);
                }
                let mut out = s.clone();
                for (id, name) in &self.ids {
                    out = out.replace(id.as_str(), name);
                }
                if is_timestamp(&out) {
                    return json!("<timestamp>");
                }
                json!(out)
            }
            Value::Array(items) => {
                let mut items: Vec<Value> = items.iter().map(|x| self.normalise(x)).collect();
                // Facts come in id order, and ids are random: order them by their names.
                if items.iter().all(|x| x.get("id").is_some()) {
                    items.sort_by_key(|x| x["id"].to_string());
                }
                Value::Array(items)
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.normalise(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// `2026-12-05T18:00:00Z`, `2026-12-05T18:00:00.123456Z`, `…+00:00`.
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[..4].iter().all(u8::is_ascii_digit)
}

/// One server under test.
struct Side {
    base: String,
    names: Names,
}

impl Side {
    async fn call(&mut self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, v) = send(&http(), method, format!("{}{path}", self.base), USER, body)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        self.names.learn(&v);
        (status, v)
    }

    /// The id of the fact whose content is `content` (known from an earlier answer).
    fn id(&self, content: &str) -> String {
        let name = format!("<fact: {content}>");
        self.names
            .ids
            .iter()
            .find(|(_, n)| **n == name)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no fact {content:?} seen"))
    }
}

/// Sends the same request to both servers (`path` with `{id}` replaced by each side's id of
/// `fact`) and asserts the same status and, normalised, the same body after `adjust`; returns
/// the status and the normalised body.
async fn same(
    sides: &mut [Side; 2],
    method: Method,
    path: &str,
    fact: Option<&str>,
    body: Option<Value>,
    adjust: impl Fn(&mut Value),
) -> (u16, Value) {
    let mut answers = Vec::new();
    for side in sides.iter_mut() {
        let path = match fact {
            Some(content) => path.replace("{id}", &side.id(content)),
            None => path.to_owned(),
        };
        let (status, v) = side.call(method.clone(), &path, body.clone()).await;
        let mut n = side.names.normalise(&v);
        adjust(&mut n);
        answers.push((status, n));
    }
    let (file, pg) = (&answers[0], &answers[1]);
    assert_eq!(
        file, pg,
        "{method} {path}: file (left) and PostgreSQL (right) answer differently"
    );
    answers.swap_remove(0)
}

fn keep(_: &mut Value) {}

/// Drops the keys that name the storage itself.
fn without_storage_keys(v: &mut Value) {
    fn strip(v: &mut Value) {
        if let Value::Object(m) = v {
            // `caches` (an extension of `/status`) names each storage's own caches.
            for k in [
                "storage_class",
                "retrieval_adapter",
                "postgres",
                "storage_path",
                "caches",
            ] {
                m.remove(k);
            }
            for x in m.values_mut() {
                strip(x);
            }
        }
    }
    strip(v);
}

/// Search hits without their scores (BM25 in FTS5 and `ts_rank` in PostgreSQL differ), in name
/// order.
fn hits_by_name(v: &mut Value) {
    if let Some(Value::Array(items)) = v.get_mut("results") {
        for x in items.iter_mut() {
            if let Value::Object(m) = x {
                m.remove("score");
            }
        }
        items.sort_by_key(ToString::to_string);
    }
}

/// The `<memory>` block's lines in sorted order (equal-ranked facts may come in id order).
fn context_lines(v: &mut Value) {
    if let Some(text) = v.get("context").and_then(Value::as_str) {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        let sorted = lines.join("\n");
        v["context"] = json!(sorted);
    }
    if let Value::Object(m) = v {
        m.remove("content_sha256");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_page_gets_the_same_answers_from_files_and_from_postgres() {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = Replica::start(
        &dir.path().join("file-root"),
        &write_config(dir.path(), "file"),
        cluster.url(),
    );
    let pg = Replica::start(
        &dir.path().join("pg-root"),
        &write_config(dir.path(), "postgres"),
        cluster.url(),
    );
    let mut s = [
        Side {
            base: file.base(),
            names: Names::default(),
        },
        Side {
            base: pg.base(),
            names: Names::default(),
        },
    ];
    let fact = |content: &str, category: &str, confidence: f64| {
        Some(json!({"content": content, "category": category, "confidence": confidence}))
    };

    // The page opens: the document of a user never written to, and the settings.
    let (status, empty) = same(&mut s, Method::GET, "/api/memory", None, None, keep).await;
    assert_eq!(status, 200);
    assert_eq!(empty["facts"], json!([]));
    let (status, _) = same(
        &mut s,
        Method::GET,
        "/api/memory/config",
        None,
        None,
        without_storage_keys,
    )
    .await;
    assert_eq!(status, 200);

    // Adding facts (one in Chinese), a duplicate, an edit, a deletion, a missing id.
    for (content, category, confidence) in [
        ("Prefers oolong tea in the morning", "preference", 0.9),
        (
            "Works as a backend engineer at a robotics startup",
            "context",
            0.8,
        ),
        ("喜欢在周末爬山", "preference", 0.7),
        ("Is learning the cello", "goal", 0.6),
    ] {
        let (status, doc) = same(
            &mut s,
            Method::POST,
            "/api/memory/facts",
            None,
            fact(content, category, confidence),
            keep,
        )
        .await;
        assert_eq!(status, 200, "{doc}");
        assert!(doc["facts"].to_string().contains(content), "{doc}");
    }
    let (status, _) = same(
        &mut s,
        Method::POST,
        "/api/memory/facts",
        None,
        fact("Prefers oolong tea in the morning", "preference", 0.9),
        keep,
    )
    .await;
    assert_eq!(status, 409);
    let (status, edited) = same(
        &mut s,
        Method::PATCH,
        "/api/memory/facts/{id}",
        Some("Is learning the cello"),
        Some(json!({"content": "Is learning the cello and the piano", "confidence": 0.75})),
        keep,
    )
    .await;
    assert_eq!(status, 200, "{edited}");
    assert!(
        edited.to_string().contains("cello and the piano"),
        "{edited}"
    );
    let (status, _) = same(
        &mut s,
        Method::DELETE,
        "/api/memory/facts/{id}",
        Some("Works as a backend engineer at a robotics startup"),
        None,
        keep,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = same(
        &mut s,
        Method::DELETE,
        "/api/memory/facts/fact_does_not_exist",
        None,
        None,
        keep,
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = same(
        &mut s,
        Method::PATCH,
        "/api/memory/facts/{id}",
        Some("Prefers oolong tea in the morning"),
        Some(json!({"confidence": 1.5})),
        keep,
    )
    .await;
    assert_eq!(status, 422);

    // Search (English and Chinese) and the category filter.
    for q in [
        "/api/memory/search?q=oolong%20tea",
        "/api/memory/search?q=%E7%88%AC%E5%B1%B1",
        "/api/memory/search?q=cello&category=goal",
        "/api/memory/search?q=cello&category=preference",
        "/api/memory/search?q=",
    ] {
        let (status, _) = same(&mut s, Method::GET, q, None, None, hits_by_name).await;
        assert_eq!(status, 200, "{q}");
    }

    // Backup and restore, reload, status, the injection block.
    let (status, export) = same(&mut s, Method::GET, "/api/memory/export", None, None, keep).await;
    assert_eq!(status, 200);
    assert_eq!(
        export["facts"].as_array().map(Vec::len),
        Some(3),
        "{export}"
    );
    let mut backup = Vec::new();
    for side in &mut s {
        let (status, mut doc) = side.call(Method::GET, "/api/memory/export", None).await;
        assert_eq!(status, 200);
        doc["facts"]
            .as_array_mut()
            .expect("facts")
            .retain(|f| f["category"] != "goal");
        backup.push(doc);
    }
    for (side, doc) in s.iter_mut().zip(backup) {
        let (status, v) = side
            .call(Method::POST, "/api/memory/import", Some(doc))
            .await;
        assert_eq!(status, 200, "{v}");
    }
    for (method, path) in [
        (Method::POST, "/api/memory/reload"),
        (Method::GET, "/api/memory"),
        (Method::GET, "/api/memory/status"),
    ] {
        let (status, _) = same(&mut s, method, path, None, None, without_storage_keys).await;
        assert_eq!(status, 200, "{path}");
    }
    let (status, block) = same(
        &mut s,
        Method::GET,
        "/api/memory/context?thread_id=t1&run_id=r1",
        None,
        None,
        context_lines,
    )
    .await;
    assert_eq!(status, 200, "{block}");
    assert!(block.to_string().contains("oolong"), "{block}");

    // Clearing: everything goes, on both.
    let (status, _) = same(&mut s, Method::DELETE, "/api/memory", None, None, keep).await;
    assert_eq!(status, 200);
    let (_, cleared) = same(&mut s, Method::GET, "/api/memory", None, None, keep).await;
    assert_eq!(cleared["facts"], json!([]));
    drop((file, pg));
}
