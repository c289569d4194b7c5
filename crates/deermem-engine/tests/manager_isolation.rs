//! User and agent isolation through the DeerMem manager: two users and two agents interleaving
//! extraction (immediate and queued), searches and CRUD never see each other's facts; an omitted
//! agent is `__default__`; agent names are case-insensitive; unsafe user ids get a hashed bucket
//! while facts record the raw id; hostile input is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod manager_support;

use deermem_core::ports::MemoryManagerExt as _;
use std::time::Duration;

use deermem_core::ports::{ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact};
use deermem_core::{InvalidInputCode, ManagerError, UserId};
use deermem_engine::IngestStatus;
use manager_support::{config, file_env, ids, scope, search, turn, user};

const BOB: &str = "bob@example.com";

fn contents(doc: &deermem_core::PublicMemoryDocument) -> Vec<String> {
    let mut c: Vec<String> = doc.facts.iter().map(|f| f.content.clone()).collect();
    c.sort();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_agents_never_see_each_other() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let alice = scope("alice", None);
    let alice_coder = scope("alice", Some("Coder"));
    let bob = scope(BOB, None);
    let bob_coder = scope(BOB, Some("coder"));

    // Immediate extraction (offline rules), interleaved across users and agents.
    for (s, text) in [
        (&alice, "I prefer green tea"),
        (&bob_coder, "I prefer Go for services"),
        (&alice_coder, "I prefer Rust for services"),
        (&bob, "I prefer black coffee"),
    ] {
        let report = m
            .ingest_now(turn("shared-thread", s.clone(), text))
            .await
            .expect("ingest");
        assert!(
            matches!(report.status, IngestStatus::Committed { .. }),
            "{report:?}"
        );
        assert_eq!(report.added.len(), 1, "{report:?}");
    }
    // Queued extraction: the same thread id for all four scopes stays four separate items.
    for (s, text) in [
        (&bob, "I like sailing"),
        (&alice, "I like hiking"),
        (&bob_coder, "I like emacs"),
        (&alice_coder, "I like vim"),
    ] {
        m.add(turn("shared-thread", s.clone(), text))
            .await
            .expect("add");
    }
    assert_eq!(m.pipeline().queue().pending_count(), 4);
    assert!(m.shutdown_flush(Duration::from_secs(30)).await);

    let expect = [
        (&alice, vec!["User likes hiking", "User prefers green tea"]),
        (
            &alice_coder,
            vec!["User likes vim", "User prefers Rust for services"],
        ),
        (
            &bob,
            vec!["User likes sailing", "User prefers black coffee"],
        ),
        (
            &bob_coder,
            vec!["User likes emacs", "User prefers Go for services"],
        ),
    ];
    for (s, want) in &expect {
        let doc = m.get_memory((*s).clone()).await.expect("get");
        assert_eq!(contents(&doc), *want, "scope {s:?}");
        // Every fact records the raw user id and the canonical agent.
        for f in &doc.facts {
            let fs = f.scope.as_ref().expect("scope");
            assert_eq!(fs.user_id.as_deref(), s.user.as_ref().map(UserId::as_str));
            let agent = s.agent.as_ref().map_or("__default__", |a| a.as_str());
            assert_eq!(fs.agent_name.as_deref(), Some(agent));
        }
        // Searches stay in the scope, on the index path and on the substring path.
        for q in ["prefers", "User", "ike"] {
            let hits = m.search(search(q, 10, (*s).clone())).await.expect("search");
            assert!(!hits.is_empty(), "{q} in {s:?}");
            for hit in hits {
                assert!(
                    want.contains(&hit.content.as_str()),
                    "{q}: {hit:?} leaked into {s:?}"
                );
            }
        }
    }
    // Another scope's content is not found at all.
    assert!(
        m.search(search("hiking", 10, bob.clone()))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        m.search(search("hiking", 10, alice_coder.clone()))
            .await
            .unwrap()
            .is_empty()
    );

    // Injection: the user's summaries and that agent's facts only.
    let ctx = m
        .get_context(ContextRequest {
            scope: alice.clone(),
            thread_id: None,
        })
        .await
        .unwrap();
    assert!(ctx.contains("green tea") && ctx.contains("hiking"), "{ctx}");
    assert!(!ctx.contains("coffee") && !ctx.contains("Rust"), "{ctx}");

    // CRUD across scopes: another scope's fact id is not found, and nothing changes.
    let alice_doc = m.get_memory(alice.clone()).await.unwrap();
    let alice_id = alice_doc.facts[0].id.clone();
    for other in [&bob, &alice_coder, &bob_coder] {
        assert!(matches!(
            m.delete_fact(&alice_id, None, (*other).clone()).await,
            Err(ManagerError::NotFound { .. })
        ));
        assert!(matches!(
            m.update_fact(
                &alice_id,
                FactPatch {
                    content: Some("hijacked".into()),
                    ..FactPatch::default()
                },
                (*other).clone()
            )
            .await,
            Err(ManagerError::NotFound { .. })
        ));
    }
    assert_eq!(m.get_memory(alice.clone()).await.unwrap(), alice_doc);

    // Clearing one agent of one user leaves everyone else alone.
    let cleared = m.clear_memory(bob_coder.clone()).await.unwrap();
    assert!(cleared.facts.is_empty());
    assert_eq!(m.get_memory(bob.clone()).await.unwrap().facts.len(), 2);
    assert_eq!(
        m.get_memory(alice_coder.clone()).await.unwrap().facts.len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_bucket_case_and_unsafe_user_ids() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let (_, default_id) = m
        .create_fact(NewFact::new("Default bucket fact"), scope("alice", None))
        .await
        .unwrap();
    let (_, coder_id) = m
        .create_fact(NewFact::new("Coder fact"), scope("alice", Some("Coder")))
        .await
        .unwrap();
    // An omitted agent is the reserved __default__ bucket.
    let omitted = m.get_memory(scope("alice", None)).await.unwrap();
    let explicit = m
        .get_memory(scope("alice", Some("__default__")))
        .await
        .unwrap();
    assert_eq!(omitted, explicit);
    assert_eq!(ids(&omitted), vec![default_id.unwrap()]);
    assert!(
        env.root()
            .join("users/alice/agents/__default__/facts")
            .is_dir()
    );
    // `Coder`, `coder` and `CODER` are one agent, stored lowercase.
    let coder_id = coder_id.unwrap();
    for name in ["Coder", "coder", "CODER"] {
        let doc = m.get_memory(scope("alice", Some(name))).await.unwrap();
        assert_eq!(ids(&doc), vec![coder_id.clone()], "{name}");
        assert_eq!(
            doc.facts[0].scope.as_ref().unwrap().agent_name.as_deref(),
            Some("coder")
        );
    }
    assert!(env.root().join("users/alice/agents/coder").is_dir());
    assert!(!env.root().join("users/alice/agents/Coder").exists());

    // An unsafe user id lands in a hashed bucket; the fact records the raw id.
    let (doc, id) = m
        .create_fact(NewFact::new("Bob's fact"), scope(BOB, None))
        .await
        .unwrap();
    let id = id.unwrap();
    assert_eq!(
        doc.facts[0].scope.as_ref().unwrap().user_id.as_deref(),
        Some(BOB)
    );
    let bucket = user(BOB).bucket().to_owned();
    assert!(bucket.starts_with("bob-example-com-"), "{bucket}");
    assert_eq!(bucket.len(), "bob-example-com-".len() + 16);
    let files = manager_support::markdown_files(&env.root().join("users").join(&bucket));
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].ends_with(format!("{id}.md")));
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.contains(BOB), "{text}");
    let mut users: Vec<String> = std::fs::read_dir(env.root().join("users"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    users.sort();
    assert_eq!(users, vec!["alice".to_owned(), bucket]);

    // A path-like user id cannot escape the root.
    m.create_fact(NewFact::new("Escaping fact"), scope("../evil", None))
        .await
        .unwrap();
    assert!(!env.dir.path().parent().unwrap().join("evil").exists());
    let evil = user("../evil").bucket().to_owned();
    assert!(evil.starts_with("---evil-"));
    assert_eq!(
        manager_support::markdown_files(&env.root().join("users").join(evil)).len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_a_typed_error() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let s = scope("alice", None);
    let (_, id) = m
        .create_fact(NewFact::new("Kept fact"), s.clone())
        .await
        .unwrap();
    let id = id.unwrap();
    let huge = "x".repeat(10 * 1024 * 1024);
    for bad in ["../etc/passwd", "a\0b", "fact/1", huge.as_str(), ""] {
        for r in [
            m.delete_fact(bad, None, s.clone()).await,
            m.update_fact(
                bad,
                FactPatch {
                    content: Some("x".into()),
                    ..FactPatch::default()
                },
                s.clone(),
            )
            .await,
        ] {
            assert!(
                matches!(
                    r,
                    Err(ManagerError::InvalidInput {
                        code: InvalidInputCode::FactId,
                        ..
                    })
                ),
                "{:?}",
                r.map(|d| d.facts.len())
            );
        }
    }
    // Long content and categories are stored, as the reference stores them (the host's
    // boundary bounds a request; injection skips a fact that cannot fit its budget).
    let big = m.create_fact(NewFact::new(huge.clone()), s.clone()).await;
    let (big, big_id) = big.expect("a long fact is stored");
    assert!(big.facts.iter().any(|f| f.content.len() == huge.len()));
    let long_category = m
        .create_fact(
            NewFact {
                category: "c".repeat(10_000),
                ..NewFact::new("fine")
            },
            s.clone(),
        )
        .await;
    let (long_category, category_id) = long_category.expect("a long category is stored");
    assert!(long_category.facts.iter().any(|f| f.content == "fine"));
    let q = m.search(search(&huge, 5, s.clone())).await;
    assert!(matches!(q, Err(ManagerError::InvalidInput { .. })));
    for thread in ["a\0b".to_owned(), "t".repeat(5000)] {
        let r = m.add(turn(&thread, s.clone(), "I prefer tea")).await;
        assert!(matches!(r, Err(ManagerError::InvalidInput { .. })), "{r:?}");
        let r = m.ingest_now(turn(&thread, s.clone(), "I prefer tea")).await;
        assert!(matches!(r, Err(ManagerError::InvalidInput { .. })));
    }
    // A hostile query is searched as text, never an error.
    for q in [
        "\"unbalanced",
        "a OR",
        "NEAR(",
        "*",
        "col:x",
        "💥 ' -- DROP",
    ] {
        m.search(search(q, 5, s.clone())).await.expect(q);
    }
    // Nothing was lost: the kept fact and the two long ones.
    let mut want = vec![id, big_id.unwrap(), category_id.unwrap()];
    want.sort();
    let mut got = ids(&m.get_memory(s).await.unwrap());
    got.sort();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_user_scope_refuses_calls_without_a_user() {
    let mut cfg = config();
    cfg.strict_user_scope = true;
    let env = file_env(cfg, None);
    let m = &env.manager;
    let none = MemoryScope::new(None, None);
    fn is_user_error<T>(r: &Result<T, ManagerError>) -> bool {
        matches!(
            r,
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::UserId,
                ..
            })
        )
    }
    assert!(is_user_error(
        &m.add(turn("t", none.clone(), "I prefer tea")).await
    ));
    assert!(is_user_error(&m.get_memory(none.clone()).await));
    assert!(is_user_error(
        &m.search(search("tea", 5, none.clone())).await
    ));
    assert!(is_user_error(
        &m.create_fact(NewFact::new("x"), none.clone()).await
    ));
    assert!(is_user_error(&m.clear_memory(none.clone()).await));
    assert!(is_user_error(
        &m.get_context(ContextRequest {
            scope: none,
            thread_id: None
        })
        .await
    ));
    // With a user everything works.
    let (_, id) = m
        .create_fact(NewFact::new("x"), scope("alice", None))
        .await
        .unwrap();
    assert!(id.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_no_user_layout_is_separate_from_users() {
    let env = file_env(config(), None);
    let m = &env.manager;
    let legacy = MemoryScope::new(None, None);
    m.create_fact(NewFact::new("Legacy layout fact"), legacy.clone())
        .await
        .unwrap();
    m.create_fact(NewFact::new("Default user fact"), scope("default", None))
        .await
        .unwrap();
    assert_eq!(
        contents(&m.get_memory(legacy).await.unwrap()),
        vec!["Legacy layout fact"]
    );
    assert_eq!(
        contents(&m.get_memory(scope("default", None)).await.unwrap()),
        vec!["Default user fact"]
    );
    assert!(env.root().join("memory.json").is_file());
    assert!(env.root().join("users/default/memory.json").is_file());
}
