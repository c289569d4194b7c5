//! Manager search and lifecycle: the index first, the substring scan over the whole bucket when the
//! index finds nothing or fails, the category filter before the cut, access heat only under hybrid
//! or shadow eviction, the lazy per-scope rebuild until a full warm-up, and shutdown, warm and
//! close.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod manager_support;

use deermem_core::ports::MemoryManagerExt as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use deermem_core::config::EmbeddingProvider;
use deermem_core::policy::eviction::EvictionPolicy;
use deermem_core::ports::{ContextRequest, MemoryManager, MemoryStorage, NewFact, SearchRequest};
use deermem_core::{
    ApplyOptions, ChangeSet, InvalidInputCode, ManagerError, MatchType, MemoryMode, OverloadScope,
    RebuildReport, SearchMode,
};
use deermem_engine::{DeerMemManager, QueueConfig};
use deermem_storage_file::{FileStorage, FileStorageConfig};
use deermem_testkit::llm::ScriptedLlm;
use deermem_testkit::storage::InMemoryStorage;
use deermem_updater::{DeerMemConfig, TokenCounting};
use manager_support::{
    HookedStorage, RebuildCall, agent, answer, clock, config, file_env, file_storage,
    hooked_manager, labelled, parts, scope, search, turn, user,
};
use serde_json::{Value, json};

async fn seed(storage: &dyn MemoryStorage, u: &str, a: &str, facts: Vec<Value>) {
    let changes = ChangeSet {
        upserts: facts
            .into_iter()
            .map(|f| deermem_core::FactDraft::try_from(f).expect("a valid draft"))
            .collect(),
        ..ChangeSet::default()
    };
    storage
        .apply_changes(
            Some(&user(u)),
            Some(&agent(a)),
            changes,
            ApplyOptions::default(),
        )
        .await
        .unwrap();
}

fn fact(id: &str, content: &str, category: &str, confidence: f64) -> Value {
    json!({"id": id, "content": content, "category": category, "confidence": confidence})
}

/// A manager whose index search always fails, so every search takes the manager's substring
/// path (the reference's `DeerMem.search` tests stub FTS to return nothing).
fn substring_only(cfg: DeerMemConfig) -> (Arc<DeerMemManager>, Arc<HookedStorage>) {
    let clock = clock();
    let inner = Arc::new(InMemoryStorage::new(clock.clone()));
    let hooked = Arc::new(HookedStorage::new(inner));
    hooked
        .fail_search
        .store(true, std::sync::atomic::Ordering::SeqCst);
    (hooked_manager(cfg, hooked.clone(), clock), hooked)
}

fn contents(hits: &[deermem_core::PublicFact]) -> Vec<&str> {
    hits.iter().map(|f| f.content.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substring_path_matches_case_insensitively_ranked_by_confidence() {
    let (m, hooked) = substring_only(config());
    seed(
        hooked.as_ref(),
        "u",
        "__default__",
        vec![
            fact("a", "User prefers Python", "preference", 0.6),
            fact("b", "Knows Java", "context", 0.95),
            fact("c", "python scripts at work", "context", 0.9),
            fact("d", "Teaches PYTHON", "behavior", 0.3),
            fact("e", "Python with zero confidence", "context", 0.0),
        ],
    )
    .await;
    let s = scope("u", None);
    for q in ["PYTHON", "python", "Python", "  python  "] {
        let hits = m.search(search(q, 10, s.clone())).await.unwrap();
        assert_eq!(
            contents(&hits),
            vec![
                "python scripts at work",
                "User prefers Python",
                "Teaches PYTHON",
                "Python with zero confidence"
            ],
            "{q}"
        );
        assert!(hits.iter().all(|h| h.source == "unknown"));
    }
    let scored = m
        .search_scored(search("python", 10, s.clone()))
        .await
        .unwrap();
    assert!(scored.iter().all(|h| h.match_type == MatchType::Substring));
    let scores: Vec<f64> = scored.iter().map(|h| h.score.unwrap()).collect();
    assert_eq!(
        scores,
        vec![0.9, 0.6, 0.3, 0.0],
        "0.0 stays 0.0 on the manager path"
    );
    // Blank queries, no match, non-positive top_k and an empty bucket return nothing.
    for (q, k) in [("", 5), ("   ", 5), ("rust", 5), ("python", 0)] {
        assert!(
            m.search(search(q, k, s.clone())).await.unwrap().is_empty(),
            "{q} {k}"
        );
    }
    assert!(
        m.search(search("python", 5, scope("nobody", None)))
            .await
            .unwrap()
            .is_empty()
    );
    // top_k cuts after ranking; a huge top_k is fine.
    assert_eq!(
        contents(&m.search(search("python", 2, s.clone())).await.unwrap()),
        vec!["python scripts at work", "User prefers Python"]
    );
    assert_eq!(
        m.search(search("python", usize::MAX, s.clone()))
            .await
            .unwrap()
            .len(),
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substring_path_filters_category_before_the_cut_and_has_no_hundred_cap() {
    let (m, hooked) = substring_only(config());
    let mut facts = vec![
        fact("pref", "tea preference", "preference", 0.5),
        fact("ctx", "tea context", "context", 0.99),
    ];
    for i in 0..150 {
        facts.push(fact(
            &format!("bulk_{i:03}"),
            &format!("bulk tea {i}"),
            "goal",
            0.1,
        ));
    }
    facts.push(fact("zlast", "needle at the end", "goal", 0.2));
    seed(hooked.as_ref(), "u", "__default__", facts).await;
    let s = scope("u", None);
    let req = SearchRequest {
        category: Some("preference".into()),
        ..search("tea", 1, s.clone())
    };
    assert_eq!(
        contents(&m.search(req).await.unwrap()),
        vec!["tea preference"]
    );
    let all = m.search(search("tea", 200, s.clone())).await.unwrap();
    assert_eq!(all.len(), 152, "category None returns every category");
    // A fact beyond the first 100 by id is still found (the reference's storage scan capped at
    // 100; the manager scan never did).
    assert_eq!(
        contents(&m.search(search("needle", 5, s.clone())).await.unwrap()),
        vec!["needle at the end"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_first_then_substring_when_it_finds_nothing_or_fails() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    for (content, category, confidence) in [
        ("Uses PostgreSQL with pgvector", "context", 0.8),
        ("Drinks tea daily", "preference", 0.5),
        ("Tea tasting notes", "context", 0.99),
    ] {
        m.create_fact(
            NewFact {
                content: content.into(),
                category: category.into(),
                confidence,
            },
            s.clone(),
        )
        .await
        .unwrap();
    }
    let fts = m
        .search_scored(search("pgvector", 5, s.clone()))
        .await
        .unwrap();
    assert_eq!(fts.len(), 1);
    assert_eq!(fts[0].match_type, MatchType::Fts5);
    assert_eq!(fts[0].fact.source, "manual");
    // A mid-word fragment is not an index term: the substring scan finds it.
    let sub = m
        .search_scored(search("gresql", 5, s.clone()))
        .await
        .unwrap();
    assert_eq!(sub.len(), 1);
    assert_eq!(sub[0].match_type, MatchType::Substring);
    assert_eq!(sub[0].fact.content, "Uses PostgreSQL with pgvector");
    // The category filter applies before the cut on the index path too.
    let req = SearchRequest {
        category: Some("preference".into()),
        ..search("tea", 1, s.clone())
    };
    assert_eq!(
        contents(&m.search(req).await.unwrap()),
        vec!["Drinks tea daily"]
    );

    // An index failure falls back to the substring scan.
    let hooked = Arc::new(HookedStorage::new(Arc::new(env.storage.clone())));
    hooked.fail_search.store(true, Ordering::SeqCst);
    let m2 = hooked_manager(config(), hooked.clone(), env.clock.clone());
    let hits = m2
        .search_scored(search("pgvector", 5, s.clone()))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].match_type, MatchType::Substring);
    assert!(hooked.search_calls.load(Ordering::SeqCst) >= 1);
}

/// A search names its mode, or takes the configured one: `bm25` without an embedder, `hybrid`
/// with one, `search.mode` when set. The vector modes without an embedder are refused with a
/// typed error (never answered silently by BM25) before the index is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_mode_is_passed_to_the_index_and_vector_modes_need_an_embedder() {
    let env = file_env(config(), None);
    let s = scope("alice", None);
    env.manager
        .create_fact(
            NewFact {
                content: "Prefers oolong tea".into(),
                category: "preference".into(),
                confidence: 0.9,
            },
            s.clone(),
        )
        .await
        .unwrap();
    let with_mode = |mode: Option<SearchMode>| SearchRequest {
        mode,
        ..search("oolong", 5, s.clone())
    };

    // No embedder: the default and `bm25` rank by words; `vector`/`hybrid` are refused.
    let hooked = Arc::new(HookedStorage::new(Arc::new(env.storage.clone())));
    let m = hooked_manager(config(), hooked.clone(), env.clock.clone());
    for mode in [None, Some(SearchMode::Bm25)] {
        let hits = m.search_scored(with_mode(mode)).await.unwrap();
        assert_eq!(hits.len(), 1, "{mode:?}");
        assert_eq!(hits[0].match_type, MatchType::Fts5);
    }
    for mode in [SearchMode::Vector, SearchMode::Hybrid] {
        let err = m.search_scored(with_mode(Some(mode))).await.unwrap_err();
        match err {
            ManagerError::InvalidInput { code, message } => {
                assert_eq!(code, InvalidInputCode::Other);
                assert_eq!(
                    message,
                    format!(
                        "search mode {} needs an embedder: set backend_config.embedding",
                        mode.as_str()
                    )
                );
            }
            other => panic!("{mode:?}: {other:?}"),
        }
    }
    assert_eq!(
        *hooked.search_modes.lock().unwrap(),
        vec![Some(SearchMode::Bm25), Some(SearchMode::Bm25)]
    );

    // An embedder configured: the default is hybrid, and every mode is passed on.
    let mut cfg = config();
    cfg.embedding.provider = EmbeddingProvider::Local;
    cfg.embedding.model_path = Some("/models/minilm".into());
    let hooked = Arc::new(HookedStorage::new(Arc::new(env.storage.clone())));
    let m = hooked_manager(cfg.clone(), hooked.clone(), env.clock.clone());
    for mode in [
        None,
        Some(SearchMode::Bm25),
        Some(SearchMode::Vector),
        Some(SearchMode::Hybrid),
    ] {
        m.search_scored(with_mode(mode)).await.unwrap();
    }
    assert_eq!(
        *hooked.search_modes.lock().unwrap(),
        vec![
            Some(SearchMode::Hybrid),
            Some(SearchMode::Bm25),
            Some(SearchMode::Vector),
            Some(SearchMode::Hybrid),
        ]
    );

    // `search.mode` sets the default.
    cfg.search.mode = Some(SearchMode::Vector);
    let hooked = Arc::new(HookedStorage::new(Arc::new(env.storage.clone())));
    let m = hooked_manager(cfg, hooked.clone(), env.clock.clone());
    m.search_scored(with_mode(None)).await.unwrap();
    assert_eq!(
        *hooked.search_modes.lock().unwrap(),
        vec![Some(SearchMode::Vector)]
    );
}

/// The substring fallback is unchanged under any mode: an index that finds nothing still
/// leaves the scan over the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substring_fallback_applies_under_every_mode() {
    let mut cfg = config();
    cfg.embedding.provider = EmbeddingProvider::Openai;
    let (m, hooked) = substring_only(cfg);
    seed(
        hooked.as_ref(),
        "u",
        "__default__",
        vec![fact("a", "User prefers Python", "preference", 0.6)],
    )
    .await;
    for mode in [SearchMode::Bm25, SearchMode::Vector, SearchMode::Hybrid] {
        let req = SearchRequest {
            mode: Some(mode),
            ..search("prefers py", 5, scope("u", None))
        };
        let hits = m.search_scored(req).await.unwrap();
        assert_eq!(hits.len(), 1, "{mode:?}");
        assert_eq!(hits[0].match_type, MatchType::Substring);
    }
}

async fn accesses_under(cfg: DeerMemConfig) -> Vec<Vec<String>> {
    let clock = clock();
    let inner = Arc::new(InMemoryStorage::new(clock.clone()));
    let hooked = Arc::new(HookedStorage::new(inner));
    let m = hooked_manager(cfg, hooked.clone(), clock);
    seed(
        hooked.as_ref(),
        "u",
        "__default__",
        vec![
            fact("fact_a", "likes green tea", "preference", 0.9),
            fact("fact_b", "likes black tea", "preference", 0.8),
            fact("fact_c", "owns a bike", "context", 0.8),
        ],
    )
    .await;
    let s = scope("u", None);
    assert_eq!(
        m.search(search("tea", 5, s.clone())).await.unwrap().len(),
        2
    );
    assert!(
        m.search(search("nothing", 5, s.clone()))
            .await
            .unwrap()
            .is_empty()
    );
    m.get_context(ContextRequest {
        scope: s,
        thread_id: None,
    })
    .await
    .unwrap();
    hooked.accesses.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_heat_is_recorded_only_under_hybrid_or_shadow() {
    assert!(accesses_under(config()).await.is_empty());
    let hybrid = DeerMemConfig {
        fact_eviction_policy: EvictionPolicy::HybridV1,
        ..config()
    };
    let shadow = DeerMemConfig {
        fact_eviction_shadow_enabled: true,
        ..config()
    };
    for cfg in [hybrid, shadow] {
        let mut got = accesses_under(cfg).await;
        assert_eq!(
            got.len(),
            1,
            "one search with hits, injection records nothing"
        );
        got[0].sort();
        assert_eq!(got[0], vec!["fact_a", "fact_b"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_search_writes_the_usage_sidecar() {
    let env = file_env(
        DeerMemConfig {
            fact_eviction_policy: EvictionPolicy::HybridV1,
            ..config()
        },
        None,
    );
    let s = scope("alice", None);
    let (_, id) = env
        .manager
        .create_fact(NewFact::new("Rides a red bicycle"), s.clone())
        .await
        .unwrap();
    let usage = env
        .root()
        .join("users/alice/agents/__default__/.metadata/fact-usage.json");
    assert!(!usage.exists());
    env.manager
        .search(search("bicycle", 5, s.clone()))
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&usage).unwrap()).unwrap();
    assert_eq!(v[id.unwrap()]["accessCount"], json!(1));
}

fn report(failed: usize, fatal: bool) -> RebuildReport {
    RebuildReport {
        supported: true,
        indexed: 1,
        failed,
        fatal,
        reason: None,
    }
}

fn hooked_file() -> (Arc<DeerMemManager>, Arc<HookedStorage>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let clock = clock();
    let storage = file_storage(dir.path(), clock.clone());
    let hooked = Arc::new(HookedStorage::new(Arc::new(storage)));
    (hooked_manager(config(), hooked.clone(), clock), hooked, dir)
}

fn scope_key(u: &str, a: &str) -> RebuildCall {
    Some(vec![(Some(user(u)), agent(a))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_warm_up_rebuilds_each_scope_once_until_fully_warmed() {
    let (m, hooked, _dir) = hooked_file();
    m.search(search("tea", 5, scope("alice", None)))
        .await
        .unwrap();
    m.search(search("tea", 5, scope("alice", None)))
        .await
        .unwrap();
    m.search(search("tea", 5, scope("bob", Some("coder"))))
        .await
        .unwrap();
    assert_eq!(
        hooked.rebuild_calls(),
        vec![scope_key("alice", "__default__"), scope_key("bob", "coder")]
    );
    // A partial failure still counts as warm: not retried.
    hooked.script_rebuild(report(1, false));
    m.search(search("tea", 5, scope("carol", None)))
        .await
        .unwrap();
    m.search(search("tea", 5, scope("carol", None)))
        .await
        .unwrap();
    assert_eq!(hooked.rebuild_calls().len(), 3);
    // A fatal failure is retried on the next search, then the scope is warm.
    hooked.script_rebuild(report(0, true));
    m.search(search("tea", 5, scope("dave", None)))
        .await
        .unwrap();
    m.search(search("tea", 5, scope("dave", None)))
        .await
        .unwrap();
    m.search(search("tea", 5, scope("dave", None)))
        .await
        .unwrap();
    assert_eq!(hooked.rebuild_calls().len(), 5);
    assert_eq!(hooked.rebuild_calls()[4], scope_key("dave", "__default__"));
    // After a full warm-up no scope is rebuilt lazily any more.
    assert!(!m.retrieval_warmed());
    let r = m.warm_retrieval().await;
    assert!(!r.fatal && r.supported);
    assert!(m.retrieval_warmed());
    assert_eq!(hooked.rebuild_calls()[5], None);
    m.search(search("tea", 5, scope("erin", None)))
        .await
        .unwrap();
    assert_eq!(hooked.rebuild_calls().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_retrieval_partial_failure_is_warm_and_fatal_is_retried() {
    let (m, hooked, _dir) = hooked_file();
    hooked.script_rebuild(report(0, true));
    let r = m.warm_retrieval().await;
    assert!(r.fatal);
    assert!(
        !m.retrieval_warmed(),
        "a fatal rebuild does not mark the manager warm"
    );
    // The lazy path stays on after a fatal warm-up.
    m.search(search("tea", 5, scope("alice", None)))
        .await
        .unwrap();
    assert_eq!(hooked.rebuild_calls().len(), 2);
    hooked.script_rebuild(report(1, false));
    let r = m.warm_retrieval().await;
    assert_eq!(r.failed, 1);
    assert!(
        m.retrieval_warmed(),
        "partial fact failures still count as warm"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_retrieval_indexes_facts_written_elsewhere_and_survives_restart() {
    let env = file_env(config(), None);
    // Another process (no index) writes a fact: our index does not know it yet.
    let other =
        FileStorage::new(FileStorageConfig::new(env.root()), env.clock.clone(), None).unwrap();
    seed(
        &other,
        "alice",
        "__default__",
        vec![fact("fact_warm", "warm index check", "context", 0.9)],
    )
    .await;
    let r = env.manager.warm_retrieval().await;
    assert_eq!(
        (r.supported, r.indexed, r.failed, r.fatal),
        (true, 1, 0, false)
    );
    let hits = env
        .manager
        .search_scored(search("warm", 5, scope("alice", None)))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].match_type, MatchType::Fts5);

    // A created fact with a non-core category is found after a restart on the same root.
    let (_, id) = env
        .manager
        .create_fact(
            NewFact {
                content: "retrieval BM25 restart retrieval check".into(),
                category: "knowledge".into(),
                confidence: 0.9,
            },
            scope("alice", Some("coder")),
        )
        .await
        .unwrap();
    env.manager.close().await;
    let storage = file_storage(&env.root(), env.clock.clone());
    let restarted =
        DeerMemManager::new(parts(config(), Arc::new(storage), env.clock.clone(), None)).unwrap();
    let hits = restarted
        .search_scored(search(
            "restart retrieval",
            5,
            scope("alice", Some("coder")),
        ))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(Some(hits[0].fact.id.clone()), id);
    assert_eq!(hits[0].match_type, MatchType::Fts5);
    assert_eq!(hits[0].fact.category, "other");
    assert_eq!(
        hits[0].fact.category_extension.as_deref(),
        Some("knowledge")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flush_drains_pending_updates() {
    let clock = clock();
    let storage = Arc::new(InMemoryStorage::new(clock.clone()));
    let llm = Arc::new(ScriptedLlm::new([
        answer(&[labelled("User likes tea", "preference", 0.9)]),
        answer(&[labelled("User likes chess", "preference", 0.9)]),
        answer(&[labelled("User likes jazz", "preference", 0.9)]),
    ]));
    let mut p = parts(config(), storage.clone(), clock, Some(llm.clone()));
    p.queue = Some(QueueConfig {
        debounce: Duration::from_secs(3600),
        max_depth: 1000,
        max_concurrency: 1,
        max_user_bytes: 0,
        max_total_bytes: 0,
    });
    let m = DeerMemManager::new(p).unwrap();
    for t in ["t1", "t2", "t3"] {
        m.add(turn(t, scope("u", None), "Let us talk about hobbies"))
            .await
            .unwrap();
    }
    assert_eq!(m.pipeline().queue().pending_count(), 3);
    assert_eq!(llm.calls(), 0, "debounced");
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);
    assert_eq!(m.pipeline().queue().pending_count(), 0);
    assert_eq!(llm.calls(), 3);
    assert!(
        m.shutdown_flush(Duration::from_secs(1)).await,
        "idle is true at once"
    );
    let doc = m.get_memory(scope("u", None)).await.unwrap();
    assert_eq!(
        doc.facts.len(),
        3,
        "{:?}",
        doc.facts.iter().map(|f| &f.content).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backpressure_never_fails_add() {
    let clock = clock();
    let storage = Arc::new(InMemoryStorage::new(clock.clone()));
    let mut p = parts(config(), storage, clock, None);
    p.queue = Some(QueueConfig {
        debounce: Duration::from_secs(3600),
        max_depth: 1,
        max_concurrency: 1,
        max_user_bytes: 0,
        max_total_bytes: 0,
    });
    let m = DeerMemManager::new(p).unwrap();
    let talk = "Let us talk about the weather today";
    m.add(turn("t1", scope("u", None), talk)).await.unwrap();
    m.add(turn("t2", scope("u", None), talk)).await.unwrap();
    assert_eq!(m.pipeline().queue().pending_count(), 1);
    assert_eq!(m.pipeline().queue().stats().rejected, 1);
    // The emergency path is never refused for depth.
    m.add_nowait(turn("t3", scope("u", None), talk))
        .await
        .unwrap();
    assert_eq!(m.pipeline().queue().stats().rejected, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_beyond_the_pending_byte_limits_are_overloaded_errors() {
    let clock = clock();
    let storage = Arc::new(InMemoryStorage::new(clock.clone()));
    // From the configuration keys: 64 KiB per user, 96 KiB in total.
    let cfg = DeerMemConfig {
        debounce_seconds: 120,
        queue_max_pending_bytes_per_user: 64 * 1024,
        queue_max_pending_bytes: 96 * 1024,
        ..config()
    };
    let m = DeerMemManager::new(parts(cfg, storage, clock, None)).unwrap();
    // About 16.6 KiB per turn: three fit a user's 64 KiB, five everyone's 96 KiB.
    let big = format!("I prefer green tea. {}", "tea ".repeat(4 * 1024));
    for t in ["t1", "t2", "t3"] {
        m.add(turn(t, scope("u", None), &big)).await.unwrap();
    }
    let err = m.add(turn("t4", scope("u", None), &big)).await.unwrap_err();
    match &err {
        ManagerError::Overloaded {
            scope: OverloadScope::User,
            message,
            retry_after,
        } => {
            assert!(message.contains("this user's pending turns"), "{message}");
            assert_eq!(*retry_after, Duration::from_secs(120), "the debounce");
        }
        other => panic!("{other:?}"),
    }
    m.add(turn("t1", scope("v", None), &big)).await.unwrap();
    m.add(turn("t2", scope("v", None), &big)).await.unwrap();
    assert!(matches!(
        m.add_nowait(turn("t3", scope("w", None), &big)).await,
        Err(ManagerError::Overloaded {
            scope: OverloadScope::Global,
            ..
        })
    ));
    // Processed turns release their bytes.
    assert!(m.shutdown_flush(Duration::from_secs(60)).await);
    m.add(turn("t4", scope("u", None), &big)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_close_and_unsupported_operations() {
    let (m, hooked, _dir) = hooked_file();
    assert_eq!(m.warm().await, Some(true), "char counting needs no warm-up");
    let clock = clock();
    let tik = DeerMemManager::new(parts(
        DeerMemConfig {
            token_counting: TokenCounting::Tiktoken,
            ..config()
        },
        Arc::new(InMemoryStorage::new(clock.clone())),
        clock,
        None,
    ))
    .unwrap();
    assert_eq!(tik.warm().await, Some(true), "the bundled encoding loads");
    assert_eq!(m.name(), "DeerMem");
    assert_eq!(m.mode(), MemoryMode::Middleware);
    assert!(matches!(
        m.delete_memory(scope("u", None)).await,
        Err(ManagerError::Unsupported { .. })
    ));
    m.create_fact(NewFact::new("export me"), scope("u", None))
        .await
        .unwrap();
    assert_eq!(
        m.export_memory(scope("u", None)).await.unwrap(),
        m.get_memory(scope("u", None)).await.unwrap()
    );
    m.close().await;
    m.close().await;
    assert_eq!(
        hooked.closes.load(Ordering::SeqCst),
        1,
        "close is idempotent"
    );
    // After close, add is refused quietly (logged), never a panic or an error.
    m.add(turn("t", scope("u", None), "I prefer tea"))
        .await
        .unwrap();
    assert_eq!(m.pipeline().queue().pending_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_picks_up_out_of_band_edits_and_reindexes_the_scope() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", Some("coder"));
    let (_, id) = m
        .create_fact(NewFact::new("Deploys with original tooling"), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    assert_eq!(
        m.search_scored(search("original", 5, s.clone()))
            .await
            .unwrap()[0]
            .match_type,
        MatchType::Fts5
    );
    // Someone edits the Markdown file by hand.
    let files = manager_support::markdown_files(&env.root().join("users/alice/agents/coder"));
    assert_eq!(files.len(), 1);
    assert!(files[0].ends_with(format!("{id}.md")));
    let text = std::fs::read_to_string(&files[0]).unwrap();
    std::fs::write(&files[0], text.replace("original", "rewritten")).unwrap();
    let doc = m.reload_memory(s.clone()).await.unwrap();
    assert_eq!(doc.facts[0].content, "Deploys with rewritten tooling");
    assert_eq!(m.get_memory(s.clone()).await.unwrap(), doc);
    let hits = m
        .search_scored(search("rewritten", 5, s.clone()))
        .await
        .unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(
        hits[0].match_type,
        MatchType::Fts5,
        "the scope was re-indexed"
    );
    assert!(
        m.search(search("original", 5, s.clone()))
            .await
            .unwrap()
            .is_empty()
    );
    // A user never written to reloads as the empty template.
    let empty = m.reload_memory(scope("nobody", None)).await.unwrap();
    assert_eq!((empty.version.as_str(), empty.revision), ("1.0", Some(0)));
    assert!(empty.facts.is_empty());
}
