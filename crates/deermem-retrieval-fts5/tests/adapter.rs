//! FTS5 adapter tests beyond the port contract: parity with the Python reference's search
//! results (`expected.json`), CJK search, scoring, robustness of the index file, persistence,
//! concurrency, and a property test over arbitrary query text.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use deermem_core::fact::{FactDraft, NormalizeContext, normalize_fact};
use deermem_core::ports::Retrieval;
use deermem_core::{
    AgentName, Fact, FactId, FactScope, MatchType, RetrievalError, Scope, SearchQuery, Timestamp,
    UserId,
};
use deermem_retrieval_fts5::{Fts5Retrieval, INDEX_DIR, INDEX_FILE_NAME};
use deermem_testkit::clock::ManualClock;
use deermem_testkit::retrieval::{fact, fact_with, scope};
use serde_json::{Value, json};

fn clock(at: &str) -> Arc<ManualClock> {
    Arc::new(ManualClock::at(at))
}

fn memory_index() -> Fts5Retrieval {
    Fts5Retrieval::in_memory(clock("2026-01-02T00:00:00Z")).expect("in-memory index")
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    deermem_testkit::block_on(f)
}

async fn ids_for(index: &Fts5Retrieval, text: &str, s: &Scope, top_k: usize) -> Vec<String> {
    index
        .search(&SearchQuery::new(text, s.clone(), top_k))
        .await
        .expect("search")
        .into_iter()
        .map(|h| h.fact.id.as_str().to_owned())
        .collect()
}

/// The reference's fixture: facts per `user|agent` scope and its top-5 search hits.
mod reference_parity {
    use super::*;

    fn expected_json() -> Value {
        deermem_testkit::fixtures::python_expected()
    }

    fn load_fact(raw: &Value, fs: &FactScope) -> Fact {
        let draft = raw.as_object().expect("fact object").clone();
        let id = FactId::new(draft["id"].as_str().expect("id")).expect("fact id");
        let new_id = move || id.clone();
        let ctx = NormalizeContext {
            scope: fs,
            existing: None,
            now: Timestamp::parse_iso("2026-12-02T10:00:00Z").expect("time"),
            new_id: &new_id,
        };
        let draft = FactDraft::from_json(draft).expect("reference fact is a valid draft");
        normalize_fact(&draft, &ctx).expect("reference fact normalises")
    }

    const CJK_QUERIES: [&str; 3] = ["乌龙茶", "東京", "住んでいる"];

    #[test]
    fn english_queries_find_the_reference_hits_and_cjk_queries_find_more() {
        let expected = expected_json();
        let mut english_checked = 0;
        let mut cjk_found = 0;
        for (group, scopes) in expected.as_object().expect("groups") {
            let index = Fts5Retrieval::in_memory(clock("2026-12-02T10:00:00Z")).expect("index");
            let mut all: Vec<(Scope, Fact, String)> = Vec::new();
            let mut searches: Vec<(Scope, &serde_json::Map<String, Value>)> = Vec::new();
            for (key, view) in scopes.as_object().expect("scopes") {
                let (user, agent) = key.rsplit_once('|').expect("user|agent");
                let s = Scope::new(
                    Some(UserId::new(user).expect("user")),
                    Some(AgentName::parse(agent).expect("agent")),
                );
                let fs = s.to_fact_scope();
                for raw in view["facts"].as_array().expect("facts") {
                    let f = load_fact(raw, &fs);
                    all.push((s.clone(), f, key.clone()));
                }
                searches.push((s, view["search"].as_object().expect("search")));
            }
            let facts: Vec<(Scope, Fact)> =
                all.iter().map(|(s, f, _)| (s.clone(), f.clone())).collect();
            run(async {
                let n = index.rebuild(None, &facts).await.expect("rebuild");
                assert_eq!(n, facts.len());
                for (s, queries) in &searches {
                    for (q, hits) in *queries {
                        let ours = ids_for(&index, q, s, 5).await;
                        let theirs: Vec<&str> = hits
                            .as_array()
                            .expect("hits")
                            .iter()
                            .map(|h| h["id"].as_str().expect("hit id"))
                            .collect();
                        if CJK_QUERIES.contains(&q.as_str()) {
                            assert!(theirs.is_empty(), "the reference finds no CJK hits");
                            let want: Vec<&str> = all
                                .iter()
                                .filter(|(fs, f, _)| fs == s && f.content.contains(q.as_str()))
                                .map(|(_, f, _)| f.id.as_str())
                                .collect();
                            for w in &want {
                                assert!(
                                    ours.iter().any(|o| o == w),
                                    "{group} {s:?} {q:?}: {w} contains the query; got {ours:?}"
                                );
                            }
                            cjk_found += want.len();
                            continue;
                        }
                        for t in &theirs {
                            assert!(
                                ours.iter().any(|o| o == t),
                                "{group} {s:?} {q:?}: reference hit {t} missing from {ours:?}"
                            );
                        }
                        // Same words, same tokenizer: nothing else matches either.
                        assert_eq!(
                            ours.len(),
                            theirs.len(),
                            "{group} {s:?} {q:?}: ours {ours:?}, reference {theirs:?}"
                        );
                        english_checked += 1;
                    }
                }
            });
        }
        assert!(
            english_checked > 100,
            "checked {english_checked} English searches"
        );
        assert!(
            cjk_found >= 10,
            "found {cjk_found} CJK facts the reference misses"
        );
    }

    #[test]
    fn cjk_hits_are_reported_as_cjk_matches() {
        let index = memory_index();
        let s = scope(Some("dave@corp.example"), "__default__");
        run(async {
            index
                .upsert(
                    &s,
                    &fact(&s, "tea", "用户喜欢喝乌龙茶，不喜欢咖啡。", "identity", 0.6),
                )
                .await
                .expect("upsert");
            index
                .upsert(
                    &s,
                    &fact(
                        &s,
                        "jp",
                        "日本語のテキストも扱う。東京に住んでいる。",
                        "context",
                        1.0,
                    ),
                )
                .await
                .expect("upsert");
            index
                .upsert(
                    &s,
                    &fact(&s, "rust", "Prefers Rust for systems work.", "goal", 0.9),
                )
                .await
                .expect("upsert");
            let hits = index
                .search(&SearchQuery::new("乌龙茶", s.clone(), 5))
                .await
                .expect("search");
            assert_eq!(hits.len(), 1);
            assert_eq!(hits[0].fact.id.as_str(), "tea");
            assert_eq!(hits[0].match_type, MatchType::Cjk);
            // Mixed queries find both scripts; English hits stay fts5.
            let mixed = index
                .search(&SearchQuery::new("Rust 東京", s.clone(), 5))
                .await
                .expect("search");
            let mut got: Vec<(&str, MatchType)> = mixed
                .iter()
                .map(|h| (h.fact.id.as_str(), h.match_type))
                .collect();
            got.sort_by_key(|(id, _)| id.to_string());
            assert_eq!(got, vec![("jp", MatchType::Cjk), ("rust", MatchType::Fts5)]);
            // Single characters, kana, sub-phrases and Korean.
            assert_eq!(ids_for(&index, "茶", &s, 5).await, vec!["tea"]);
            assert_eq!(ids_for(&index, "住んで", &s, 5).await, vec!["jp"]);
            assert_eq!(ids_for(&index, "テキスト", &s, 5).await, vec!["jp"]);
            assert!(ids_for(&index, "北京", &s, 5).await.is_empty());
            index
                .upsert(
                    &s,
                    &fact(&s, "ko", "서울에서 일하고 있습니다", "context", 0.5),
                )
                .await
                .expect("upsert");
            assert_eq!(ids_for(&index, "서울", &s, 5).await, vec!["ko"]);
            assert_eq!(ids_for(&index, "일하고", &s, 5).await, vec!["ko"]);
            // The reference's jieba-only test: a sub-phrase of a Chinese sentence.
            index
                .upsert(&s, &fact(&s, "zh", "中文检索支持验证", "context", 0.5))
                .await
                .expect("upsert");
            assert_eq!(ids_for(&index, "检索", &s, 5).await, vec!["zh"]);
            assert_eq!(ids_for(&index, "支持验证", &s, 5).await, vec!["zh"]);
            // Advanced syntax with CJK runs.
            assert_eq!(ids_for(&index, "乌龙茶 AND 咖啡", &s, 5).await, vec!["tea"]);
            assert!(ids_for(&index, "乌龙茶 AND Rust", &s, 5).await.is_empty());
            assert_eq!(ids_for(&index, "\"東京に住\"", &s, 5).await, vec!["jp"]);
        });
    }

    #[test]
    fn exact_substring_ranks_above_partial_bigram_matches() {
        let index = memory_index();
        let s = scope(Some("u"), "a");
        run(async {
            // Unrelated documents give the bigrams a meaningful IDF.
            for i in 0..20 {
                let f = fact(
                    &s,
                    &format!("filler{i}"),
                    &format!("filler text {i}"),
                    "context",
                    0.5,
                );
                index.upsert(&s, &f).await.expect("upsert");
            }
            index
                .upsert(&s, &fact(&s, "partial", "龙茶很好", "context", 0.6))
                .await
                .expect("upsert");
            index
                .upsert(&s, &fact(&s, "exact", "我喝乌龙茶", "context", 0.3))
                .await
                .expect("upsert");
            assert_eq!(
                ids_for(&index, "乌龙茶", &s, 5).await,
                vec!["exact", "partial"]
            );
        });
    }
}

/// Scoring details that the port contract does not pin.
mod scoring {
    use super::*;

    #[test]
    fn recent_facts_outrank_old_ones_and_zero_confidence_counts_as_half() {
        let index = Fts5Retrieval::in_memory(clock("2026-12-02T00:00:00Z")).expect("index");
        let s = scope(Some("u"), "a");
        let old = fact_with(
            &s,
            "old",
            "alpha beta",
            json!({"confidence": 0.5, "createdAt": "2020-01-01T00:00:00Z"}),
        );
        let new = fact_with(
            &s,
            "new",
            "alpha beta",
            json!({"confidence": 0.5, "createdAt": "2026-12-01T00:00:00Z"}),
        );
        let naive = fact_with(
            &s,
            "naive",
            "alpha beta",
            json!({"confidence": 0.0, "createdAt": "2020-01-01T00:00:00"}),
        );
        run(async {
            for f in [&old, &new, &naive] {
                index.upsert(&s, f).await.expect("upsert");
            }
            let hits = index
                .search(&SearchQuery::new("\"alpha beta\"", s.clone(), 5))
                .await
                .expect("phrase query");
            let ids: Vec<&str> = hits.iter().map(|h| h.fact.id.as_str()).collect();
            // The naive timestamp skips decay, and 0.0 scores as 0.5: it ties with "new".
            assert_eq!(ids, vec!["new", "naive", "old"]);
            assert!((hits[0].score - hits[1].score).abs() < 1e-12);
            let rel = hits[0].bm25.expect("bm25");
            assert!(rel > 0.0);
            assert!((hits[0].score - (rel + 0.1)).abs() < 1e-9);
            assert!(hits[2].score < hits[1].score);
        });
    }

    #[test]
    fn per_scope_candidates_merge_by_score_across_scopes() {
        let index = memory_index();
        let a = scope(Some("u"), "a");
        let b = scope(Some("u"), "b");
        run(async {
            index
                .upsert(&a, &fact(&a, "a1", "lima", "context", 0.1))
                .await
                .expect("upsert");
            index
                .upsert(&b, &fact(&b, "b1", "lima", "context", 0.9))
                .await
                .expect("upsert");
            let q = SearchQuery {
                text: "lima".into(),
                scopes: vec![a.clone(), b.clone(), a.clone()],
                top_k: 5,
                category: None,
                mode: None,
            };
            let hits = index.search(&q).await.expect("search");
            let ids: Vec<&str> = hits.iter().map(|h| h.fact.id.as_str()).collect();
            assert_eq!(ids, vec!["b1", "a1"], "duplicate scopes are searched once");
            assert_eq!(hits[1].fact.scope.agent_name.as_deref(), Some("a"));
        });
    }

    #[test]
    fn advanced_syntax_passes_through_and_invalid_syntax_retries_as_words() {
        let index = memory_index();
        let s = scope(Some("u"), "a");
        run(async {
            index
                .upsert(&s, &fact(&s, "p", "python and rust", "context", 0.5))
                .await
                .expect("upsert");
            index
                .upsert(&s, &fact(&s, "q", "python only", "context", 0.5))
                .await
                .expect("upsert");
            assert_eq!(ids_for(&index, "python AND rust", &s, 5).await, vec!["p"]);
            assert_eq!(ids_for(&index, "pyth*", &s, 5).await.len(), 2);
            assert_eq!(ids_for(&index, "python NOT rust", &s, 5).await, vec!["q"]);
            // Unbalanced: retried as the quoted words "(rust" and "python".
            let mut got = ids_for(&index, "(rust python", &s, 5).await;
            got.sort();
            assert_eq!(got, vec!["p", "q"]);
            // `C++ OR Rust` is valid syntax for the reference too.
            assert_eq!(ids_for(&index, "C++ OR Rust", &s, 5).await, vec!["p"]);
        });
    }
}

/// The index file: location, corruption, permissions, schema versions, persistence.
mod robustness {
    use super::*;

    fn index_file(root: &std::path::Path) -> PathBuf {
        root.join(INDEX_DIR).join(INDEX_FILE_NAME)
    }

    async fn assert_works(index: &Fts5Retrieval) {
        let s = scope(Some("alice"), "coder");
        index
            .upsert(&s, &fact(&s, "f", "robust search works", "context", 0.5))
            .await
            .expect("upsert");
        assert_eq!(ids_for(index, "robust", &s, 5).await, vec!["f"]);
    }

    /// A new index file has 16 KiB pages (a vector row stays in its b-tree leaf); a file
    /// created with 4 KiB pages keeps them and still works.
    #[test]
    fn new_files_get_16_kib_pages_and_older_files_keep_theirs() {
        let page_size = |path: &std::path::Path| {
            let head = std::fs::read(path).expect("read index");
            u32::from(u16::from_be_bytes([head[16], head[17]]))
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            assert_works(&index).await;
            index.close().await;
        });
        assert_eq!(page_size(&index_file(dir.path())), 16 * 1024);

        let old = tempfile::tempdir().expect("tempdir");
        let file = index_file(old.path());
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        let conn = rusqlite::Connection::open(&file).expect("sqlite");
        conn.execute_batch("PRAGMA page_size=4096; CREATE TABLE t(x); DROP TABLE t;")
            .expect("4 KiB file");
        drop(conn);
        let index = Fts5Retrieval::open(old.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            assert_works(&index).await;
            index.close().await;
        });
        assert_eq!(page_size(&file), 4096);
    }

    #[test]
    fn missing_folder_is_created() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("not/yet/there");
        let index = Fts5Retrieval::open(&root, clock("2026-01-01T00:00:00Z")).expect("open");
        assert_eq!(index.path(), Some(index_file(&root).as_path()));
        run(async {
            assert_works(&index).await;
            let stats = index.stats().await.expect("stats");
            assert_eq!(stats.adapter, "fts5");
            assert_eq!(
                stats.db_path.as_deref(),
                Some(index_file(&root).to_str().expect("utf8"))
            );
            assert!(stats.db_bytes.unwrap_or(0) > 0);
            assert_eq!(stats.jieba, cfg!(feature = "zh"));
        });
        assert!(index_file(&root).is_file());
    }

    #[test]
    fn corrupt_file_is_deleted_and_recreated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(
            &file,
            b"this is not a sqlite database at all, just garbage....",
        )
        .expect("write");
        let mut wal = file.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::write(&wal, b"garbage wal").expect("write wal");
        let index =
            Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("recreated");
        run(async {
            assert_eq!(index.stats().await.expect("stats").total_docs, 0);
            assert_works(&index).await;
        });
    }

    /// Writes an index under `root` holding one fact (see [`assert_works`]) and closes it.
    fn index_one_fact_and_close(root: &std::path::Path) {
        let index = Fts5Retrieval::open(root, clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            assert_works(&index).await;
            index.close().await;
        });
    }

    #[test]
    fn truncated_database_is_recreated() {
        let dir = tempfile::tempdir().expect("tempdir");
        index_one_fact_and_close(dir.path());
        let file = index_file(dir.path());
        let bytes = std::fs::read(&file).expect("read");
        // Keep the header, destroy the pages.
        let mut damaged = bytes[..100.min(bytes.len())].to_vec();
        damaged.extend(std::iter::repeat_n(0xA5u8, 8192));
        std::fs::write(&file, damaged).expect("write");
        let index =
            Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("recreated");
        run(assert_works(&index));
    }

    #[test]
    fn a_busy_index_is_reported_unavailable_and_left_intact() {
        let dir = tempfile::tempdir().expect("tempdir");
        index_one_fact_and_close(dir.path());
        let file = index_file(dir.path());
        let before = std::fs::read(&file).expect("read");
        // Another process holds the database exclusively (as a long rebuild or a stuck
        // process would) for longer than our busy timeout.
        let holder = rusqlite::Connection::open(&file).expect("holder");
        holder
            .execute_batch("PRAGMA locking_mode=EXCLUSIVE; BEGIN EXCLUSIVE;")
            .expect("lock");
        let options = deermem_retrieval_fts5::Fts5Options {
            busy_timeout_ms: 50,
            ..Default::default()
        };
        let err = Fts5Retrieval::open_file(&file, clock("2026-01-01T00:00:00Z"), options)
            .expect_err("busy");
        assert!(matches!(err, RetrievalError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains(INDEX_FILE_NAME), "{err}");
        // The file was not deleted or rewritten under the other process.
        assert_eq!(std::fs::read(&file).expect("still there"), before);
        holder.execute_batch("COMMIT;").expect("commit");
        drop(holder);
        // Once the lock is gone the same index opens with its rows.
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        let s = scope(Some("alice"), "coder");
        run(async { assert_eq!(ids_for(&index, "robust", &s, 5).await, vec!["f"]) });
    }

    #[test]
    fn unusable_locations_fail_cleanly_with_unavailable() {
        let dir = tempfile::tempdir().expect("tempdir");
        // `.retrieval` is a file, so the folder cannot be created (even as root).
        std::fs::write(dir.path().join(INDEX_DIR), b"x").expect("write");
        let err =
            Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect_err("no folder");
        assert!(matches!(err, RetrievalError::Unavailable(_)), "{err:?}");
        // The index path is a folder: deleting it fails, so the retry fails too.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(index_file(dir.path())).expect("mkdir");
        let err = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect_err("dir");
        assert!(matches!(err, RetrievalError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains(INDEX_FILE_NAME), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn read_only_folder_still_answers_or_fails_cleanly() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let folder = dir.path().join(INDEX_DIR);
        std::fs::create_dir_all(&folder).expect("mkdir");
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        // Root may still write there; anyone else gets a clean `Unavailable`.
        match Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")) {
            Ok(index) => run(assert_works(&index)),
            Err(e) => assert!(matches!(e, RetrievalError::Unavailable(_)), "{e:?}"),
        }
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn incompatible_schema_version_is_rebuilt_and_foreign_tables_survive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        {
            let conn = rusqlite_conn(&file);
            conn.execute_batch(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 INSERT INTO meta VALUES('schema_version', '0');
                 CREATE TABLE docs(x);
                 CREATE VIRTUAL TABLE fts_300 USING fts5(x);
                 CREATE TABLE unrelated(y); INSERT INTO unrelated VALUES(7);",
            )
            .expect("old schema");
        }
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(assert_works(&index));
        run(index.close());
        let conn = rusqlite_conn(&file);
        let v: String = conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .expect("version");
        assert_eq!(v, deermem_retrieval_fts5::SCHEMA_VERSION);
        let y: i64 = conn
            .query_row("SELECT y FROM unrelated", [], |r| r.get(0))
            .expect("kept");
        assert_eq!(y, 7);
    }

    /// A version-1 file (before vectors) is migrated the adapter's way: emptied and recreated
    /// at the current version with the `vectors` table, and the storage refills it by a
    /// rebuild.
    #[test]
    fn a_version_1_index_is_recreated_with_the_vectors_table() {
        use deermem_core::ports::VectorIndex;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        {
            let conn = rusqlite_conn(&file);
            conn.execute_batch(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
                 INSERT INTO meta VALUES('schema_version', '1');
                 CREATE TABLE scopes(scope_key INTEGER PRIMARY KEY, scope_user TEXT NOT NULL,
                    scope_agent TEXT NOT NULL, next_seq INTEGER NOT NULL);
                 CREATE TABLE docs(id INTEGER PRIMARY KEY, scope_key INTEGER NOT NULL,
                    fact_id TEXT NOT NULL, category TEXT NOT NULL, created_us INTEGER,
                    confidence REAL NOT NULL, fact_json TEXT NOT NULL);
                 INSERT INTO scopes VALUES(1, '\"alice\"', '\"coder\"', 2);
                 INSERT INTO docs VALUES(4294967297, 1, 'old', 'context', NULL, 0.5, '{}');",
            )
            .expect("version 1 schema");
        }
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            assert_eq!(index.stats().await.expect("stats").total_docs, 0);
            assert_works(&index).await;
            assert_eq!(index.vector_coverage("m").await.expect("coverage"), (0, 1));
            index.close().await;
        });
        let conn = rusqlite_conn(&file);
        let v: String = conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .expect("version");
        assert_eq!(v, deermem_retrieval_fts5::SCHEMA_VERSION);
        let n: i64 = conn
            .query_row("SELECT count(*) FROM vectors", [], |r| r.get(0))
            .expect("vectors table");
        assert_eq!(n, 0);
    }

    /// A version-2 file (before the `script` tag) is emptied and recreated at version 3; a
    /// rebuild fills the tag from each fact's text, and the vectors are answered with the
    /// stored tag (not the text's: a tag changed by hand is what comes back).
    #[test]
    fn a_version_2_index_is_recreated_with_the_script_tag_and_a_rebuild_fills_it() {
        use deermem_core::policy::language::ScriptGroup;
        use deermem_core::ports::VectorIndex;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        {
            let conn = rusqlite_conn(&file);
            conn.execute_batch(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
                 INSERT INTO meta VALUES('schema_version', '2');
                 CREATE TABLE scopes(scope_key INTEGER PRIMARY KEY, scope_user TEXT NOT NULL,
                    scope_agent TEXT NOT NULL, next_seq INTEGER NOT NULL);
                 CREATE TABLE docs(id INTEGER PRIMARY KEY, scope_key INTEGER NOT NULL,
                    fact_id TEXT NOT NULL, category TEXT NOT NULL, created_us INTEGER,
                    confidence REAL NOT NULL, fact_json TEXT NOT NULL, digest BLOB NOT NULL);
                 INSERT INTO scopes VALUES(1, '\"alice\"', '\"coder\"', 2);
                 INSERT INTO docs VALUES(4294967297, 1, 'old', 'context', NULL, 0.5, '{}', x'00');",
            )
            .expect("version 2 schema");
        }
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            assert_eq!(index.stats().await.expect("stats").total_docs, 0);
            let facts = vec![
                (
                    s.clone(),
                    fact(&s, "en", "Plays badminton on Sundays", "context", 0.5),
                ),
                (s.clone(), fact(&s, "zh", "周末打羽毛球", "context", 0.5)),
                (
                    s.clone(),
                    fact(&s, "mixed", "用 Vim 写代码", "context", 0.5),
                ),
            ];
            assert_eq!(index.rebuild(None, &facts).await.expect("rebuild"), 3);
            let tasks = index.missing_vectors("m", None, 10).await.expect("missing");
            let vectors = vec![vec![1.0, 0.0]; tasks.len()];
            index.put_vectors("m", &tasks, &vectors).await.expect("put");
        });
        let conn = rusqlite_conn(&file);
        let v: String = conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .expect("version");
        assert_eq!(v, "3");
        let tags: Vec<(String, String)> = conn
            .prepare("SELECT fact_id, script FROM docs ORDER BY fact_id")
            .expect("prepare")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        let tags: Vec<(&str, &str)> = tags.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(tags, vec![("en", "other"), ("mixed", "cjk"), ("zh", "cjk")]);
        let tagged = |index: &Fts5Retrieval| {
            let mut got: Vec<(String, ScriptGroup)> =
                run(index.scope_vectors_tagged(std::slice::from_ref(&s), "m"))
                    .expect("vectors")
                    .into_iter()
                    .map(|(f, _, g)| (f.id.as_str().to_owned(), g))
                    .collect();
            got.sort();
            got
        };
        assert_eq!(
            tagged(&index),
            vec![
                ("en".to_owned(), ScriptGroup::Other),
                ("mixed".to_owned(), ScriptGroup::Cjk),
                ("zh".to_owned(), ScriptGroup::Cjk)
            ]
        );
        // The tag read is the stored one.
        conn.execute("UPDATE docs SET script='cjk' WHERE fact_id='en'", [])
            .expect("update");
        assert_eq!(tagged(&index)[0], ("en".to_owned(), ScriptGroup::Cjk));
        // The untagged answer is the same documents.
        let plain = run(index.scope_vectors(std::slice::from_ref(&s), "m")).expect("vectors");
        assert_eq!(plain.len(), 3);
        run(index.close());
    }

    /// A stored vector whose blob is damaged (wrong length, a NaN, a wrong dimension) is never
    /// an error: it is not returned, the document is listed as missing again, and a new vector
    /// replaces it.
    #[test]
    fn damaged_vector_blobs_count_as_missing() {
        use deermem_core::ports::VectorIndex;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            for id in ["a", "b", "c"] {
                index
                    .upsert(&s, &fact(&s, id, &format!("text {id}"), "context", 0.5))
                    .await
                    .expect("upsert");
            }
            let tasks = index.missing_vectors("m", None, 10).await.expect("missing");
            let vectors = vec![vec![1.0, 0.0]; 3];
            assert_eq!(
                index.put_vectors("m", &tasks, &vectors).await.expect("put"),
                3
            );
        });
        {
            let conn = rusqlite_conn(&file);
            conn.execute_batch(
                "UPDATE vectors SET vec = x'0000' WHERE fact_id = 'a';
                 UPDATE vectors SET vec = x'0000C07F00000000' WHERE fact_id = 'b';
                 UPDATE vectors SET dim = -1, vec = x'' WHERE fact_id = 'c';",
            )
            .expect("damage");
        }
        run(async {
            let got = index
                .scope_vectors(std::slice::from_ref(&s), "m")
                .await
                .expect("scope vectors");
            assert!(got.is_empty(), "{got:?}");
            let mut missing: Vec<String> = index
                .missing_vectors("m", None, 10)
                .await
                .expect("missing")
                .into_iter()
                .map(|t| t.fact_id)
                .collect();
            missing.sort();
            assert_eq!(missing, vec!["a", "b", "c"]);
            assert_eq!(index.vector_coverage("m").await.expect("coverage"), (0, 3));
            let tasks = index.missing_vectors("m", None, 10).await.expect("missing");
            let vectors = vec![vec![0.0, 1.0]; 3];
            assert_eq!(
                index.put_vectors("m", &tasks, &vectors).await.expect("put"),
                3
            );
            assert_eq!(
                index
                    .scope_vectors(std::slice::from_ref(&s), "m")
                    .await
                    .expect("scope vectors")
                    .len(),
                3
            );
        });
    }

    /// The ids `nearest` ranks for `vector` in scope `s` (model "m"), and whether it reports
    /// a document without a vector.
    fn ranked(index: &Fts5Retrieval, s: &Scope, vector: &[f32]) -> (Vec<String>, bool) {
        use deermem_core::policy::language::ScriptGroup;
        use deermem_core::ports::{MeaningQuery, VectorIndex};
        let ranking = run(index.nearest(&MeaningQuery {
            scopes: std::slice::from_ref(s),
            model_id: "m",
            vector,
            group: ScriptGroup::Other,
            category: None,
            limit: 10,
        }))
        .expect("nearest");
        let ids = ranking.hits.into_iter().map(|h| h.fact_id).collect();
        (ids, ranking.missing)
    }

    fn held_vector_bytes(index: &Fts5Retrieval) -> u64 {
        index
            .cache_bounds()
            .into_iter()
            .find(|c| c.name == deermem_retrieval_fts5::VECTOR_CACHE_NAME)
            .and_then(|c| c.current)
            .expect("the scope-vector cache is reported")
    }

    /// The decoded vectors a ranking keeps in memory follow every write to their scope: by
    /// another process's raw SQL, by another adapter on the same file, and by this one.
    #[test]
    fn vectors_kept_in_memory_follow_writes_from_anywhere() {
        use deermem_core::ports::VectorIndex;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        let other = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            for id in ["a", "b"] {
                index
                    .upsert(&s, &fact(&s, id, &format!("text {id}"), "context", 0.5))
                    .await
                    .expect("upsert");
            }
            let mut tasks = index.missing_vectors("m", None, 10).await.expect("missing");
            tasks.sort_by(|x, y| x.fact_id.cmp(&y.fact_id));
            let vectors = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
            assert_eq!(
                index.put_vectors("m", &tasks, &vectors).await.expect("put"),
                2
            );
        });
        assert_eq!(held_vector_bytes(&index), 0);
        assert_eq!(
            ranked(&index, &s, &[1.0, 0.0]),
            (vec!["a".into(), "b".into()], false)
        );
        assert!(
            held_vector_bytes(&index) > 0,
            "the ranking keeps the scope's vectors"
        );
        // Asked again: the same answer from memory.
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]).0, vec!["a", "b"]);

        // Another process swaps the two vectors with plain SQL.
        rusqlite_conn(&file)
            .execute_batch(
                "UPDATE vectors SET vec = x'000000000000803F' WHERE fact_id = 'a';
                 UPDATE vectors SET vec = x'0000803F00000000' WHERE fact_id = 'b';",
            )
            .expect("swap");
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]).0, vec!["b", "a"]);

        // Another adapter on the same file removes one fact.
        run(async {
            other.remove(&s, "b").await.expect("remove");
            other.close().await;
        });
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]), (vec!["a".into()], false));

        // This adapter adds a fact without a vector: reported missing at once.
        run(index.upsert(&s, &fact(&s, "c", "text c", "context", 0.5))).expect("upsert");
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]), (vec!["a".into()], true));
        run(index.close());
    }

    /// A version-3 file written before the write stamps existed gets them at open, in place:
    /// its vectors are kept, and a ranking kept in memory still follows raw writes.
    #[test]
    fn a_file_without_write_stamps_gets_them_at_open_and_keeps_its_vectors() {
        use deermem_core::ports::VectorIndex;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = index_file(dir.path());
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            index
                .upsert(&s, &fact(&s, "a", "text a", "context", 0.5))
                .await
                .expect("upsert");
            let tasks = index.missing_vectors("m", None, 10).await.expect("missing");
            index
                .put_vectors("m", &tasks, &[vec![1.0, 0.0]])
                .await
                .expect("put");
            index.close().await;
        });
        let conn = rusqlite_conn(&file);
        conn.execute_batch(
            "DROP TRIGGER docs_gen_insert; DROP TRIGGER docs_gen_delete;
             DROP TRIGGER docs_gen_update; DROP TRIGGER vectors_gen_insert;
             DROP TRIGGER vectors_gen_delete; DROP TRIGGER vectors_gen_update;
             DROP TABLE scope_gen;",
        )
        .expect("an older file");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).expect(sql) };
        assert_eq!(count("SELECT count(*) FROM scope_gen"), 1);
        assert_eq!(
            count("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"),
            6
        );
        assert_eq!(
            count("SELECT count(*) FROM vectors"),
            1,
            "the vectors are kept"
        );
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]), (vec!["a".into()], false));
        conn.execute("DELETE FROM vectors WHERE fact_id = 'a'", [])
            .expect("delete");
        assert_eq!(ranked(&index, &s, &[1.0, 0.0]), (vec![], true));
        run(index.close());
    }

    fn rusqlite_conn(path: &std::path::Path) -> rusqlite::Connection {
        rusqlite::Connection::open(path).expect("open sqlite")
    }

    #[test]
    fn malformed_rows_are_skipped_not_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            index
                .upsert(&s, &fact(&s, "good", "mike shared", "context", 0.4))
                .await
                .expect("upsert");
            index
                .upsert(&s, &fact(&s, "bad", "mike shared", "context", 0.9))
                .await
                .expect("upsert");
            index
                .upsert(&s, &fact(&s, "worse", "mike shared", "context", 0.8))
                .await
                .expect("upsert");
        });
        {
            let conn = rusqlite_conn(&index_file(dir.path()));
            conn.execute(
                "UPDATE docs SET fact_json='{not json' WHERE fact_id='bad'",
                [],
            )
            .expect("damage");
            conn.execute(
                "UPDATE docs SET fact_json='{\"id\":\"worse\",\"content\":5}' WHERE fact_id='worse'",
                [],
            )
            .expect("damage");
        }
        run(async {
            assert_eq!(ids_for(&index, "mike", &s, 5).await, vec!["good"]);
            assert_eq!(
                ids_for(&index, "mike", &s, 1).await,
                vec!["good"],
                "skips backfill"
            );
        });
    }

    #[test]
    fn ten_megabyte_facts_and_hostile_ids_are_handled() {
        let index = memory_index();
        let s = scope(Some("../../etc/passwd"), "coder");
        let mut content = "sierra ".repeat(1_000_000);
        content.push_str(&"东京乌龙茶".repeat(600_000));
        content.push_str(" tail\0word");
        assert!(content.len() > 10_000_000);
        run(async {
            index
                .upsert(&s, &fact(&s, "big", &content, "context", 0.5))
                .await
                .expect("upsert");
            assert_eq!(ids_for(&index, "sierra", &s, 5).await, vec!["big"]);
            assert_eq!(ids_for(&index, "龙茶", &s, 5).await, vec!["big"]);
            assert_eq!(ids_for(&index, "tail", &s, 5).await, vec!["big"]);
            index.remove(&s, "big").await.expect("remove");
            assert!(ids_for(&index, "sierra", &s, 5).await.is_empty());
        });
    }

    #[test]
    fn index_persists_across_restart_with_category_filter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = scope(Some("alice"), "coder");
        {
            let index =
                Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
            run(async {
                index
                    .upsert(&s, &fact(&s, "one", "november one", "preference", 0.5))
                    .await
                    .expect("upsert");
                index
                    .upsert(&s, &fact(&s, "two", "november two", "context", 0.9))
                    .await
                    .expect("upsert");
                index.close().await;
            });
        }
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("reopen");
        run(async {
            let q = SearchQuery {
                text: "november".into(),
                scopes: vec![s.clone()],
                top_k: 5,
                category: Some("preference".into()),
                mode: None,
            };
            let hits = index.search(&q).await.expect("search");
            assert_eq!(hits.len(), 1);
            assert_eq!(hits[0].fact.id.as_str(), "one");
            assert_eq!(hits[0].match_type, MatchType::Fts5);
            // New documents after a restart do not collide with old rowids.
            index
                .upsert(&s, &fact(&s, "three", "november three", "context", 0.1))
                .await
                .expect("upsert");
            assert_eq!(
                ids_for(&index, "november", &s, 5).await,
                vec!["two", "one", "three"]
            );
        });
    }

    #[test]
    fn corruption_found_later_is_healed_by_a_full_rebuild() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = scope(Some("alice"), "coder");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        run(async {
            index
                .upsert(&s, &fact(&s, "a", "oscar", "context", 0.4))
                .await
                .expect("upsert");
        });
        {
            // Move everything into the main file, then destroy every page but the first,
            // behind the adapter's back.
            let file = index_file(dir.path());
            let conn = rusqlite_conn(&file);
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .expect("checkpoint");
            drop(conn);
            let bytes = std::fs::read(&file).expect("read");
            let mut damaged = bytes[..4096].to_vec();
            damaged.extend(std::iter::repeat_n(0xA5u8, bytes.len() - 4096));
            std::fs::write(&file, damaged).expect("write");
        }
        run(async {
            let r = index.search(&SearchQuery::new("oscar", s.clone(), 5)).await;
            assert!(
                matches!(r, Err(RetrievalError::Unavailable(_))),
                "corruption is reported for the substring fallback: {r:?}"
            );
            assert!(matches!(
                index.stats().await,
                Err(RetrievalError::Unavailable(_))
            ));
            let last = index.last_error().expect("the failure is remembered");
            assert!(last.contains("malformed"), "{last}");
            let facts = vec![(s.clone(), fact(&s, "a", "oscar", "context", 0.4))];
            assert_eq!(index.rebuild(None, &facts).await.expect("heal"), 1);
            assert_eq!(ids_for(&index, "oscar", &s, 5).await, vec!["a"]);
            assert_eq!(index.stats().await.expect("stats").total_docs, 1);
        });
    }
}

/// Several tasks and threads at once.
mod concurrency {
    use super::*;

    #[test]
    fn concurrent_upserts_are_all_searchable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        let s = scope(Some("alice"), "coder");
        run(async {
            let mut tasks = Vec::new();
            for t in 0..8 {
                let index = index.clone();
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..5 {
                        let id = format!("f{t}_{i}");
                        let f = fact(&s, &id, "concurrent memory write", "context", 0.5);
                        index.upsert(&s, &f).await.expect("upsert");
                        let _ = index
                            .search(&SearchQuery::new("concurrent", s.clone(), 3))
                            .await
                            .expect("search");
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            let hits = index
                .search(&SearchQuery::new("concurrent memory", s.clone(), 100))
                .await
                .expect("search");
            assert_eq!(hits.len(), 40);
        });
    }

    #[test]
    fn reads_of_other_scopes_see_committed_data_during_rebuilds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Fts5Retrieval::open(dir.path(), clock("2026-01-01T00:00:00Z")).expect("open");
        let a = scope(Some("alice"), "coder");
        let b = scope(Some("bob"), "coder");
        run(async {
            index
                .upsert(&b, &fact(&b, "keep", "papa stays", "context", 0.5))
                .await
                .expect("upsert");
            let big: Vec<(Scope, Fact)> = (0..3000)
                .map(|i| {
                    (
                        a.clone(),
                        fact(&a, &format!("r{i}"), &format!("quebec {i}"), "context", 0.5),
                    )
                })
                .collect();
            let writer = {
                let index = index.clone();
                let a = a.clone();
                tokio::spawn(async move {
                    for _ in 0..3 {
                        index
                            .rebuild(Some(std::slice::from_ref(&a)), &big)
                            .await
                            .expect("rebuild");
                    }
                })
            };
            for _ in 0..50 {
                assert_eq!(ids_for(&index, "papa", &b, 5).await, vec!["keep"]);
                let n = ids_for(&index, "quebec", &a, 5000).await.len();
                assert!(
                    n == 0 || n == 3000,
                    "a reader sees all or nothing of a rebuild: {n}"
                );
            }
            writer.await.expect("writer");
            assert_eq!(ids_for(&index, "quebec", &a, 5000).await.len(), 3000);
        });
    }

    #[test]
    fn works_without_a_tokio_runtime() {
        let index = memory_index();
        let s = scope(Some("u"), "a");
        futures_lite_block_on(async {
            index
                .upsert(&s, &fact(&s, "x", "romeo", "context", 0.5))
                .await
                .expect("upsert");
            assert_eq!(ids_for(&index, "romeo", &s, 5).await, vec!["x"]);
            index.close().await;
        });
    }

    /// A minimal executor (no tokio context) for futures that never wait.
    fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut f = std::pin::pin!(f);
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }
}

/// Arbitrary query text never errors and never panics.
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn seeded() -> (Fts5Retrieval, Scope) {
        let index = memory_index();
        let s = scope(Some("alice"), "coder");
        run(async {
            for (i, c) in [
                "Prefers Rust for systems work",
                "用户喜欢喝乌龙茶，不喜欢咖啡。",
                "東京に住んでいる",
                "Quotes 'single' and \"double\" and back\\slash.",
                "C++ OR (AND) NOT NEAR*",
            ]
            .iter()
            .enumerate()
            {
                index
                    .upsert(&s, &fact(&s, &format!("p{i}"), c, "context", 0.5))
                    .await
                    .expect("upsert");
            }
        });
        (index, s)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_query_text_is_answered(text in "\\PC{0,64}", top_k in 0usize..20) {
            let (index, s) = seeded();
            let hits = run(index.search(&SearchQuery::new(text, s, top_k)));
            let hits = hits.expect("search never errors on query text");
            prop_assert!(hits.len() <= top_k);
            prop_assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        }

        #[test]
        fn syntax_heavy_queries_are_answered(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("\"".to_owned()), Just("(".to_owned()), Just(")".to_owned()),
                    Just("*".to_owned()), Just(" AND ".to_owned()), Just(" OR ".to_owned()),
                    Just(" NOT ".to_owned()), Just("NEAR(".to_owned()), Just(":".to_owned()),
                    Just("^".to_owned()), Just("東京".to_owned()), Just("乌".to_owned()),
                    Just("rust".to_owned()), Just(" ".to_owned()), Just("\0".to_owned()),
                    Just("{".to_owned()), Just("}".to_owned()), Just("-".to_owned()),
                    "[a-z]{1,5}",
                ],
                0..24,
            ),
        ) {
            let (index, s) = seeded();
            let text: String = parts.concat();
            let hits = run(index.search(&SearchQuery::new(text, s, 10)));
            prop_assert!(hits.is_ok(), "{hits:?}");
        }
    }
}

/// The index lists the scopes it holds documents for (what a streamed full rebuild clears
/// the vanished ones from), writes accepted before the call included, cleared scopes not.
#[test]
fn indexed_scopes_lists_every_scope_with_documents() {
    run(async {
        let index = memory_index();
        assert!(index.indexed_scopes().await.unwrap().is_empty());
        let a = scope(Some("alice"), "coder");
        let b = scope(None, "writer");
        let c = scope(Some("carol@example.com"), "coder");
        for (s, id) in [(&a, "fact_a"), (&b, "fact_b"), (&c, "fact_c")] {
            index
                .upsert(s, &fact(s, id, "some words", "context", 0.9))
                .await
                .unwrap();
        }
        let mut listed = index.indexed_scopes().await.unwrap();
        listed.sort();
        let mut expected = vec![a.clone(), b.clone(), c.clone()];
        expected.sort();
        assert_eq!(listed, expected);
        index.clear(Some(std::slice::from_ref(&b))).await.unwrap();
        let listed = index.indexed_scopes().await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(!listed.contains(&b));
    });
}
