//! The `MemoryManager` contract suite: behaviours every backend must show, plus the
//! `manager_contract!` macro that registers one named test per behaviour the backend's
//! abilities allow (an ability-bound behaviour is not registered, rather than passing, for a
//! backend without the ability).
//!
//! A fixture is an async function returning a [`ManagerFixture`]: the manager under test and
//! whatever must stay alive with it (temp dirs, fake servers).

use crate::fixtures::{agent, user};
use deermem_core::ports::MemoryManagerExt as _;
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use deermem_core::ports::{
    AddRequest, ContextRequest, FactPatch, MemoryManager, MemoryScope, NewFact, SearchRequest,
};
use deermem_core::{InvalidInputCode, ManagerError, Message, PublicMemoryDocument};

/// The manager under test and the resources that must outlive it.
pub struct ManagerFixture {
    /// The backend.
    pub manager: Arc<dyn MemoryManager>,
    /// Temp dirs, servers and the like, dropped after the test.
    pub guard: Box<dyn Any + Send>,
}

impl std::fmt::Debug for ManagerFixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerFixture")
            .field("manager", &self.manager.name())
            .finish_non_exhaustive()
    }
}

fn scope(u: &str, a: Option<&str>) -> MemoryScope {
    MemoryScope::new(Some(user(u)), a.map(agent))
}

fn is_unsupported<T: std::fmt::Debug>(r: &Result<T, ManagerError>) -> bool {
    matches!(r, Err(ManagerError::Unsupported { .. }))
}

fn turn(u: &str) -> AddRequest {
    AddRequest {
        thread_id: "thread-contract".into(),
        messages: vec![
            Message::human("I prefer tea over coffee."),
            Message::ai("Noted, tea it is."),
        ],
        scope: scope(u, None),
        trace_id: None,
    }
}

fn ids(doc: &PublicMemoryDocument) -> Vec<String> {
    doc.facts.iter().map(|f| f.id.clone()).collect()
}

/// The abilities a backend exposes through its accessors, as flags the suite branches on.
#[derive(Clone, Copy, Debug)]
struct Abilities {
    search: bool,
    read_memory: bool,
    clear_memory: bool,
    import_memory: bool,
    reload_memory: bool,
    fact_crud: bool,
}

fn abilities(m: &dyn MemoryManager) -> Abilities {
    Abilities {
        search: m.searcher().is_some(),
        read_memory: m.reader().is_some(),
        clear_memory: m.admin().is_some(),
        import_memory: m.admin().is_some(),
        reload_memory: m.reloader().is_some(),
        fact_crud: m.facts().is_some(),
    }
}

/// The ability accessors a backend answers `Some` for, by name (`searcher`, `reader`,
/// `admin`, `reloader`, `facts`).
fn declared_by(m: &dyn MemoryManager) -> Vec<&'static str> {
    let mut have = Vec::new();
    for (name, present) in [
        ("searcher", m.searcher().is_some()),
        ("reader", m.reader().is_some()),
        ("admin", m.admin().is_some()),
        ("reloader", m.reloader().is_some()),
        ("facts", m.facts().is_some()),
    ] {
        if present {
            have.push(name);
        }
    }
    have
}

/// A behaviour registered for a backend must find the abilities it was registered for
/// (`manager_contract!` registers it only then).
fn require(m: &dyn MemoryManager, needed: &[&str]) {
    let have = declared_by(m);
    let missing: Vec<_> = needed.iter().filter(|n| !have.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "{} lacks {missing:?}: this behaviour is registered only for backends with it",
        m.name()
    );
}

/// The abilities given to `manager_contract!` are exactly the backend's, so the behaviours
/// registered (and those left out) follow what the backend really offers.
pub async fn declared_abilities_are_the_backends(f: ManagerFixture, declared: &[&str]) {
    let mut declared = declared.to_vec();
    declared.sort_unstable();
    let mut have = declared_by(f.manager.as_ref());
    have.sort_unstable();
    assert_eq!(
        declared,
        have,
        "manager_contract! was given other abilities than {} has",
        f.manager.name()
    );
}

/// Every optional operation either works or answers `Unsupported`, exactly as the backend's
/// ability accessors say.
pub async fn capabilities_match_behaviour(f: ManagerFixture) {
    let m = &f.manager;
    let caps = abilities(m.as_ref());
    let s = scope("cap-user", None);
    let search = m
        .search(SearchRequest {
            query: "tea".into(),
            top_k: 5,
            scope: s.clone(),
            category: None,
            mode: None,
        })
        .await;
    assert_eq!(
        is_unsupported(&search),
        !caps.search,
        "search vs capabilities: {search:?}"
    );
    let get = m.get_memory(s.clone()).await;
    assert_eq!(
        is_unsupported(&get),
        !caps.read_memory,
        "get_memory vs capabilities: {get:?}"
    );
    let reload = m.reload_memory(s.clone()).await;
    assert_eq!(
        is_unsupported(&reload),
        !caps.reload_memory,
        "reload_memory vs capabilities: {reload:?}"
    );
    let create = m
        .create_fact(NewFact::new("capability probe"), s.clone())
        .await;
    assert_eq!(
        is_unsupported(&create),
        !caps.fact_crud,
        "create_fact vs capabilities: {create:?}"
    );
    if !caps.fact_crud {
        assert!(is_unsupported(
            &m.update_fact("fact_x", FactPatch::default(), s.clone())
                .await
        ));
        assert!(is_unsupported(
            &m.delete_fact("fact_x", None, s.clone()).await
        ));
    }
    if !caps.import_memory {
        assert!(is_unsupported(
            &m.import_memory(PublicMemoryDocument::empty(), s.clone())
                .await
        ));
    }
    let clear = m.clear_memory(s.clone()).await;
    assert_eq!(
        is_unsupported(&clear),
        !caps.clear_memory,
        "clear_memory vs capabilities: {clear:?}"
    );
    if let Err(ManagerError::Unsupported { operation, backend }) = m.delete_memory(s).await {
        assert!(!operation.is_empty());
        assert_eq!(backend, m.name());
    }
}

/// `add` and `add_nowait` accept a normal turn and never fail for it; an idle or drained
/// backend flushes successfully, and reports no backend failure.
pub async fn add_is_accepted_and_flush_succeeds(f: ManagerFixture) {
    let m = &f.manager;
    m.add(turn("add-user"))
        .await
        .unwrap_or_else(|e| panic!("add failed: {e}"));
    m.add_nowait(turn("add-user"))
        .await
        .unwrap_or_else(|e| panic!("add_nowait failed: {e}"));
    assert!(
        m.shutdown_flush(Duration::from_secs(20)).await,
        "flush must drain within its budget"
    );
    assert!(
        m.shutdown_flush(Duration::from_secs(1)).await,
        "an idle flush returns true at once"
    );
    assert_eq!(
        m.last_backend_failure(),
        None,
        "a backend whose server answered reports no failure"
    );
}

/// `get_context` for a user with no memory returns text (possibly empty) and never fails.
pub async fn context_for_unknown_user_is_ok(f: ManagerFixture) {
    let text = f
        .manager
        .get_context(ContextRequest {
            scope: scope("nobody-here", None),
            thread_id: None,
        })
        .await
        .unwrap_or_else(|e| panic!("get_context failed: {e}"));
    let block = f
        .manager
        .get_context_block(ContextRequest {
            scope: scope("nobody-here", None),
            thread_id: None,
        })
        .await
        .unwrap_or_else(|e| panic!("get_context_block failed: {e}"));
    assert_eq!(block.block.is_empty(), text.trim().is_empty());
}

/// A blank query or `top_k == 0` returns no results.
pub async fn blank_search_is_empty(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["searcher"]);
    for (q, k) in [("", 5), ("   \n", 5), ("tea", 0)] {
        let r = m
            .search(SearchRequest {
                query: q.into(),
                top_k: k,
                scope: scope("blank-user", None),
                category: None,
                mode: None,
            })
            .await
            .unwrap_or_else(|e| panic!("search failed: {e}"));
        assert!(r.is_empty(), "query {q:?} top_k {k} returned {r:?}");
    }
}

/// Create, read, update and delete a fact; the document reflects each step.
pub async fn fact_crud_round_trip(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["facts"]);
    let s = scope("crud-user", None);
    let (doc, id) = m
        .create_fact(
            NewFact {
                content: "  Uses Rust daily  ".into(),
                category: "behavior".into(),
                confidence: 0.9,
            },
            s.clone(),
        )
        .await
        .unwrap_or_else(|e| panic!("create failed: {e}"));
    let id = id.expect("fact stored");
    let fact = doc
        .facts
        .iter()
        .find(|x| x.id == id)
        .expect("created fact in document");
    assert_eq!(fact.content, "Uses Rust daily");
    assert_eq!(fact.category, "behavior");
    assert_eq!(fact.source, "manual");
    assert_eq!(fact.revision, Some(1));
    let doc = m
        .update_fact(
            &id,
            FactPatch {
                content: Some("Uses Rust every day".into()),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await
        .unwrap_or_else(|e| panic!("update failed: {e}"));
    let fact = doc.facts.iter().find(|x| x.id == id).expect("updated fact");
    assert_eq!(fact.content, "Uses Rust every day");
    assert_eq!(fact.category, "behavior", "omitted fields are kept");
    assert_eq!(fact.revision, Some(2));
    let doc = m
        .get_memory(s.clone())
        .await
        .unwrap_or_else(|e| panic!("get failed: {e}"));
    assert!(ids(&doc).contains(&id));
    let doc = m
        .delete_fact(&id, None, s.clone())
        .await
        .unwrap_or_else(|e| panic!("delete failed: {e}"));
    assert!(!ids(&doc).contains(&id));
    assert!(matches!(
        m.delete_fact(&id, None, s.clone()).await,
        Err(ManagerError::NotFound { .. })
    ));
    assert!(matches!(
        m.update_fact(
            &id,
            FactPatch {
                content: Some("x".into()),
                ..FactPatch::default()
            },
            s
        )
        .await,
        Err(ManagerError::NotFound { .. })
    ));
}

/// Invalid fact input is rejected with a stable code and stores nothing.
pub async fn invalid_fact_input_is_rejected(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["facts"]);
    let s = scope("invalid-user", None);
    let bad_conf = m
        .create_fact(
            NewFact {
                confidence: 1.5,
                ..NewFact::new("x")
            },
            s.clone(),
        )
        .await;
    assert!(
        matches!(
            bad_conf,
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::Confidence,
                ..
            })
        ),
        "{bad_conf:?}"
    );
    let nan = m
        .create_fact(
            NewFact {
                confidence: f64::NAN,
                ..NewFact::new("x")
            },
            s.clone(),
        )
        .await;
    assert!(
        matches!(
            nan,
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::Confidence,
                ..
            })
        ),
        "{nan:?}"
    );
    let empty = m.create_fact(NewFact::new(" \t "), s.clone()).await;
    assert!(
        matches!(
            empty,
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::Content,
                ..
            })
        ),
        "{empty:?}"
    );
    let (_, first) = m
        .create_fact(NewFact::new("Likes green tea"), s.clone())
        .await
        .expect("create");
    assert!(first.is_some());
    let dup = m
        .create_fact(NewFact::new("  LIKES GREEN TEA "), s.clone())
        .await;
    assert!(
        matches!(
            dup,
            Err(ManagerError::InvalidInput {
                code: InvalidInputCode::DuplicateFact,
                ..
            })
        ),
        "{dup:?}"
    );
    let doc = m.get_memory(s).await.expect("get");
    assert_eq!(doc.facts.len(), 1);
}

/// An update with a stale expected revision is a conflict and changes nothing.
pub async fn stale_revision_is_a_conflict(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["facts"]);
    let s = scope("conflict-user", None);
    let (_, id) = m
        .create_fact(NewFact::new("Works in Berlin"), s.clone())
        .await
        .expect("create");
    let id = id.expect("stored");
    m.update_fact(
        &id,
        FactPatch {
            content: Some("Works in Munich".into()),
            expected_revision: Some(1),
            ..FactPatch::default()
        },
        s.clone(),
    )
    .await
    .expect("first update at revision 1");
    let stale = m
        .update_fact(
            &id,
            FactPatch {
                content: Some("Works in Paris".into()),
                expected_revision: Some(1),
                ..FactPatch::default()
            },
            s.clone(),
        )
        .await;
    assert!(
        matches!(stale, Err(ManagerError::Conflict { .. })),
        "{stale:?}"
    );
    let stale_delete = m.delete_fact(&id, Some(1), s.clone()).await;
    assert!(
        matches!(stale_delete, Err(ManagerError::Conflict { .. })),
        "{stale_delete:?}"
    );
    let doc = m.get_memory(s).await.expect("get");
    let fact = doc.facts.iter().find(|x| x.id == id).expect("fact kept");
    assert_eq!(fact.content, "Works in Munich");
}

/// Users and agents are isolated; an omitted agent is the default bucket; agent names are
/// case-insensitive.
pub async fn scopes_are_isolated(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["facts"]);
    let (_, a) = m
        .create_fact(NewFact::new("Alice fact"), scope("alice-iso", None))
        .await
        .expect("create");
    let (_, b) = m
        .create_fact(NewFact::new("Bob fact"), scope("bob-iso", None))
        .await
        .expect("create");
    let (_, c) = m
        .create_fact(
            NewFact::new("Alice coder fact"),
            scope("alice-iso", Some("Coder")),
        )
        .await
        .expect("create");
    let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
    let alice = ids(&m.get_memory(scope("alice-iso", None)).await.expect("get"));
    assert_eq!(alice, vec![a.clone()]);
    let bob = ids(&m.get_memory(scope("bob-iso", None)).await.expect("get"));
    assert_eq!(bob, vec![b.clone()]);
    let coder = ids(&m
        .get_memory(scope("alice-iso", Some("coder")))
        .await
        .expect("get"));
    assert_eq!(coder, vec![c.clone()]);
    let default = ids(&m
        .get_memory(scope("alice-iso", Some("__default__")))
        .await
        .expect("get"));
    assert_eq!(
        default,
        vec![a.clone()],
        "an omitted agent is the __default__ bucket"
    );
    // Another user's fact id is not found in my scope.
    assert!(matches!(
        m.delete_fact(&b, None, scope("alice-iso", None)).await,
        Err(ManagerError::NotFound { .. })
    ));
    assert!(ids(&m.get_memory(scope("bob-iso", None)).await.expect("get")).contains(&b));
    if abilities(m.as_ref()).search {
        let hits = m
            .search(SearchRequest {
                query: "fact".into(),
                top_k: 10,
                scope: scope("bob-iso", None),
                category: None,
                mode: None,
            })
            .await
            .expect("search");
        assert!(
            hits.iter().all(|h| h.id == b),
            "bob's search returned another scope's fact: {hits:?}"
        );
    }
}

/// A created fact is found by search in its scope, and the category filter applies.
pub async fn search_finds_created_facts(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["searcher", "facts"]);
    let s = scope("search-user", None);
    let (_, tea) = m
        .create_fact(
            NewFact {
                content: "Drinks oolong tea every morning".into(),
                category: "preference".into(),
                confidence: 0.9,
            },
            s.clone(),
        )
        .await
        .expect("create");
    m.create_fact(
        NewFact {
            content: "Has a dog named Pixel".into(),
            category: "context".into(),
            confidence: 0.8,
        },
        s.clone(),
    )
    .await
    .expect("create");
    let hits = m
        .search(SearchRequest {
            query: "oolong".into(),
            top_k: 5,
            scope: s.clone(),
            category: None,
            mode: None,
        })
        .await
        .expect("search");
    assert_eq!(hits.first().map(|h| h.id.clone()), tea);
    let filtered = m
        .search(SearchRequest {
            query: "oolong".into(),
            top_k: 5,
            scope: s,
            category: Some("context".into()),
            mode: None,
        })
        .await
        .expect("search");
    assert!(
        filtered.is_empty(),
        "category filter applies before the cut: {filtered:?}"
    );
}

/// Clearing a scope leaves an empty document.
pub async fn clear_empties_memory(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["admin"]);
    let caps = abilities(m.as_ref());
    let s = scope("clear-user", None);
    if caps.fact_crud {
        m.create_fact(NewFact::new("Temporary fact"), s.clone())
            .await
            .expect("create");
    }
    let doc = m.clear_memory(s.clone()).await.expect("clear");
    assert!(doc.facts.is_empty());
    if caps.read_memory {
        assert!(m.get_memory(s).await.expect("get").facts.is_empty());
    }
}

/// Export then import into a cleared scope gives back the same facts.
pub async fn export_import_round_trip(f: ManagerFixture) {
    let m = &f.manager;
    require(m.as_ref(), &["admin", "reader", "facts"]);
    let s = scope("roundtrip-user", None);
    m.create_fact(
        NewFact {
            content: "Prefers dark mode".into(),
            category: "preference".into(),
            confidence: 0.8,
        },
        s.clone(),
    )
    .await
    .expect("create");
    m.create_fact(
        NewFact {
            content: "Lives in 東京".into(),
            category: "context".into(),
            confidence: 0.95,
        },
        s.clone(),
    )
    .await
    .expect("create");
    let exported = m.get_memory(s.clone()).await.expect("export");
    m.clear_memory(s.clone()).await.expect("clear");
    let imported = m
        .import_memory(exported.clone(), s.clone())
        .await
        .expect("import");
    let key = |d: &PublicMemoryDocument| {
        let mut v: Vec<(String, String, String)> = d
            .facts
            .iter()
            .map(|f| (f.id.clone(), f.content.clone(), f.category.clone()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(key(&imported), key(&exported));
    assert_eq!(key(&m.get_memory(s).await.expect("get")), key(&exported));
}

/// `warm` never panics and reports a tri-state.
pub async fn warm_reports(f: ManagerFixture) {
    let _ = f.manager.warm().await;
    assert!(
        f.manager.on_pre_compress(&[]).await.is_empty()
            || abilities(f.manager.as_ref()).read_memory
    );
}

/// Expands one test per manager behaviour the backend can show: the behaviours every
/// backend has, and each ability-bound behaviour only when the backend has its abilities, as
/// listed after the fixture by accessor name (`searcher`, `reader`, `admin`, `reloader`,
/// `facts`). A run therefore lists exactly what it tested. `declared_abilities_are_the_backends`
/// checks the list against the backend, so it cannot claim or hide an ability.
///
/// ```text
/// deermem_testkit::manager_contract!(fixture(), [searcher, reader, admin, facts]);
/// ```
#[macro_export]
macro_rules! manager_contract {
    ($fixture:expr, [$($have:ident),* $(,)?]) => {
        #[test]
        fn declared_abilities_are_the_backends() {
            $crate::block_on(async {
                let fixture = $fixture.await;
                $crate::manager::declared_abilities_are_the_backends(
                    fixture,
                    &[$(stringify!($have)),*],
                )
                .await;
            });
        }
        $crate::manager_contract!(@tests $fixture;
            capabilities_match_behaviour,
            add_is_accepted_and_flush_succeeds,
            context_for_unknown_user_is_ok,
            warm_reports,
        );
        $crate::manager_contract!(@need [searcher] [$($have)*] $fixture; blank_search_is_empty);
        $crate::manager_contract!(@need [facts] [$($have)*] $fixture;
            fact_crud_round_trip,
            invalid_fact_input_is_rejected,
            stale_revision_is_a_conflict,
            scopes_are_isolated,
        );
        $crate::manager_contract!(@need [searcher facts] [$($have)*] $fixture;
            search_finds_created_facts);
        $crate::manager_contract!(@need [admin] [$($have)*] $fixture; clear_empties_memory);
        $crate::manager_contract!(@need [admin reader facts] [$($have)*] $fixture;
            export_import_round_trip);
    };
    // Every needed ability found: the tests.
    (@need [] $have:tt $fixture:expr; $($name:ident),* $(,)?) => {
        $crate::manager_contract!(@tests $fixture; $($name),*);
    };
    (@need [$need:ident $($more:ident)*] [$($have:ident)*] $fixture:expr; $($name:ident),* $(,)?) => {
        $crate::manager_contract!(@find $need [$($have)*] [$($more)*] [$($have)*] $fixture; $($name),*);
    };
    // Looking for one ability in the declared list (idents compare only as literals).
    (@find searcher [searcher $($_r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@need $more $have $($rest)*);
    };
    (@find reader [reader $($_r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@need $more $have $($rest)*);
    };
    (@find admin [admin $($_r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@need $more $have $($rest)*);
    };
    (@find reloader [reloader $($_r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@need $more $have $($rest)*);
    };
    (@find facts [facts $($_r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@need $more $have $($rest)*);
    };
    (@find $need:ident [$_other:ident $($r:ident)*] $more:tt $have:tt $($rest:tt)*) => {
        $crate::manager_contract!(@find $need [$($r)*] $more $have $($rest)*);
    };
    // Not declared: nothing registered.
    (@find $need:ident [] $more:tt $have:tt $($rest:tt)*) => {};
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::block_on(async {
                let fixture = $fixture.await;
                $crate::manager::$name(fixture).await;
                });
            }
        )*
    };
}
