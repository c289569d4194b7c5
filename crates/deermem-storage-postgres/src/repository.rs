//! The storage ports on PostgreSQL: [`PgStorage`] implements `FactRepository` (one transaction
//! per commit, the user's row locked `FOR UPDATE` so that replicas take turns, the decision
//! made by the core's shared commit policy), `FactMetadata` (usage heat and the eviction audit
//! as JSON documents per scope, edited by the core's metadata policy) and `ScopedSearch`
//! (full-text search on the `tsv` column, see [`crate::search`]; the core's substring scan
//! when a query holds no indexable term). Every fact write stores its search columns in the
//! same transaction, so search always sees the committed facts.
//!
//! Loads serve a per-scope cache of decoded facts under a read lease on the user's bucket or
//! after reading the user's row (see [`crate::lease`]); every commit revokes the other
//! replicas' leases on the bucket before it returns.
//!
//! Facts are stored in the shape the Markdown files hold them (front matter with `user_id` and
//! `agent_name` in place, then `title` and `content`), as `json` so that key order survives:
//! what is read back normalises to the very fact that was written.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use deermem_core::document::{
    ApplyOptions, ChangeResult, ChangeSet, Facts, MemoryDocument, SummaryPatch,
};
use deermem_core::policy::commit::{self, CommitRequest, CurrentRecord, Decision, StoredFact};
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::policy::metadata;
use deermem_core::policy::substring::{SubstringRules, substring_hits};
use deermem_core::ports::{
    Clock, FactMetadata, FactRepository, ListQuery, ScopedSearch, StorageCapabilities,
};
use deermem_core::search::{RebuildReport, RetrievalStatus, SearchHit, SearchQuery};
use deermem_core::{
    AgentName, Fact, FactId, Scope, StorageError, SummarySection, Timestamp, UserId,
};
use serde_json::{Map, Value};
use tokio_postgres::GenericClient;

use crate::config::Coherence;
use crate::lease::{FENCE_SQL, GRANT_SQL, LeasedUser};
use crate::search::{self, Scored, Table};
use crate::store::PgDatabase;
use crate::stored::{
    DOCUMENT_VERSION, decode_fact, decode_sections, encode_sections, fresh_id, write_fact,
    write_user,
};

/// Commits of point operations retried over concurrent unrelated commits.
const MAX_ATTEMPTS: usize = 3;

/// Scopes a replica keeps decoded at most unless told otherwise (`PgStorage::with_cache_max_scopes`,
/// which the facade sets from `cache_max_scopes`); past it the cache starts over.
pub(crate) const DEFAULT_CACHE_MAX_SCOPES: usize = 4096;

/// The storage ports over one PostgreSQL schema.
pub struct PgStorage {
    store: PgDatabase,
    clock: Arc<dyn Clock>,
    half_life_days: f64,
    audit_max_entries: usize,
    /// Decoded facts per scope, served only while the user's row is still the one they were
    /// read under (see `scope_facts`).
    cache: parking_lot::Mutex<HashMap<ScopeKey, CachedScope>>,
    /// The bound on `cache` (scopes).
    cache_max_scopes: usize,
}

/// A scope as the cache knows it: the requesting raw user id (facts are normalised for it) and
/// the agent.
type ScopeKey = (Option<String>, String);

fn scope_key(user: Option<&UserId>, agent: &AgentName) -> ScopeKey {
    (
        user.map(|u| u.as_str().to_owned()),
        agent.as_str().to_owned(),
    )
}

/// The decoded facts of a scope and the version of the user's row they were read under.
#[derive(Clone)]
struct CachedScope {
    version: RowVersion,
    facts: Facts,
}

/// What identifies one committed state of a user's row: its revision and the transaction that
/// wrote the row (`xmin`). Every commit that changes a fact updates the row in the same
/// transaction, and so does a snapshot replacing the bucket (`deermem migrate`), which may set
/// any revision: equal versions mean the facts are the ones that were cached.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RowVersion {
    revision: u64,
    xmin: String,
}

impl std::fmt::Debug for PgStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStorage")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

fn db(context: &'static str) -> impl Fn(tokio_postgres::Error) -> StorageError {
    move |e| crate::error::storage_error(context, e)
}

fn pool(e: crate::PgError) -> StorageError {
    e.into()
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::corrupt(format!("PostgreSQL {what} is not readable: {e}"))
}

fn bucket(user: Option<&UserId>) -> &str {
    user.map_or("", UserId::bucket)
}

/// A stored fact read back for `user`: normalised in its recorded scope, and owned by the
/// requesting raw id (a record naming another raw id of the bucket is `foreign_owner`).
fn from_stored(
    text: &str,
    user: Option<&UserId>,
    now: Timestamp,
) -> Result<StoredFact, StorageError> {
    let mut fact = decode_fact(text, now).map_err(|e| corrupt("fact", e.reason))?;
    let requested = user.map(UserId::as_str);
    let foreign_owner = fact.scope.user_id.as_deref() != requested;
    if foreign_owner {
        fact.scope.user_id = requested.map(str::to_owned);
    }
    Ok(StoredFact {
        fact,
        foreign_owner,
    })
}

fn sections_from(text: &str) -> Result<(SummarySection, SummarySection), StorageError> {
    decode_sections(text).map_err(|e| corrupt(e.what, e.reason))
}

/// The user's row: revision, version, summaries text, last update, and the transaction that
/// wrote it.
struct UserRow {
    revision: u64,
    version: String,
    summaries: String,
    last_updated: String,
    xmin: String,
}

/// The user's row, unlocked (read paths).
const USER_SQL: &str = "SELECT revision, version, summaries::text, coalesce(last_updated, ''), \
     xmin::text FROM users WHERE bucket = $1";
/// The user's row, locked for the commit.
const USER_SQL_LOCKED: &str = "SELECT revision, version, summaries::text, \
     coalesce(last_updated, ''), xmin::text FROM users WHERE bucket = $1 FOR UPDATE";
/// A user's row created, empty, when missing (a commit then locks it).
const CREATE_USER_SQL: &str =
    "INSERT INTO users (bucket) VALUES ($1) ON CONFLICT (bucket) DO NOTHING";
/// A scope's facts in id order.
const FACTS_SQL: &str = "SELECT fact::text FROM facts WHERE bucket = $1 AND agent = $2 \
     ORDER BY id COLLATE \"C\"";

/// A statement prepared once per pooled connection (deadpool's cache): a read then costs one
/// round trip instead of two.
async fn prepared(
    client: &deadpool_postgres::ClientWrapper,
    sql: &str,
) -> Result<tokio_postgres::Statement, StorageError> {
    client
        .prepare_cached(sql)
        .await
        .map_err(db("prepare a statement"))
}

async fn user_row<S>(
    client: &impl GenericClient,
    sql: &S,
    bucket: &str,
) -> Result<Option<UserRow>, StorageError>
where
    S: tokio_postgres::ToStatement + Sync + Send + ?Sized,
{
    let row = client
        .query_opt(sql, &[&bucket])
        .await
        .map_err(db("read the user"))?;
    row.map(|r| {
        let revision: i64 = r.get(0);
        Ok(UserRow {
            revision: u64::try_from(revision).map_err(|e| corrupt("revision", e))?,
            version: r.get(1),
            summaries: r.get(2),
            last_updated: r.get(3),
            xmin: r.get(4),
        })
    })
    .transpose()
    // A row created for a commit that wrote nothing is a user never written to.
    .map(|r| r.filter(|r| r.revision > 0))
}

impl PgStorage {
    /// The storage over `store` (already migrated), with the usage half-life in days and the
    /// audit bound of the file store's configuration.
    pub fn new(
        store: PgDatabase,
        clock: Arc<dyn Clock>,
        half_life_days: f64,
        audit_max_entries: usize,
    ) -> Self {
        Self {
            store,
            clock,
            half_life_days,
            audit_max_entries,
            cache: parking_lot::Mutex::new(HashMap::new()),
            cache_max_scopes: DEFAULT_CACHE_MAX_SCOPES,
        }
    }

    /// The same storage keeping at most `scopes` scopes decoded (at least 1): the
    /// configuration's `cache_max_scopes`, as for the file storage.
    #[must_use]
    pub fn with_cache_max_scopes(mut self, scopes: usize) -> Self {
        self.cache_max_scopes = scopes.max(1);
        self
    }

    /// The facts of a scope for a load under the user's row version `version` (`None`: the
    /// user was never written): the cached ones when they were read under the same version,
    /// else read from the database and cached under it. The version is read first (on every
    /// load, or when the lease was granted), so a scope older than the latest committed
    /// revision is never served; facts read after it may be newer than it, and are then
    /// re-read on a later load (the version differs).
    async fn scope_facts(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        user: Option<&UserId>,
        agent: &AgentName,
        version: Option<RowVersion>,
    ) -> Result<Facts, StorageError> {
        let Some(version) = version else {
            // Nothing committed: no facts to keep (a row may exist with revision 0).
            return Ok(self.facts_of(client, user, agent).await?.into());
        };
        let key = scope_key(user, agent);
        if let Some(facts) = self.cached(&key, &version) {
            return Ok(facts);
        }
        let facts: Facts = self.facts_of(client, user, agent).await?.into();
        let mut cache = self.cache.lock();
        if cache.len() >= self.cache_max_scopes && !cache.contains_key(&key) {
            cache.clear();
        }
        cache.insert(
            key,
            CachedScope {
                version,
                facts: facts.clone(),
            },
        );
        Ok(facts)
    }

    /// The cached facts of `key` when they were read under `version`.
    fn cached(&self, key: &ScopeKey, version: &RowVersion) -> Option<Facts> {
        self.cache
            .lock()
            .get(key)
            .filter(|hit| &hit.version == version)
            .map(|hit| hit.facts.clone())
    }

    /// A load under a valid lease on the user's bucket: no statement when the scope's facts
    /// are cached under the leased row, else only the facts are read.
    async fn load_leased(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        leased: &LeasedUser,
    ) -> Result<MemoryDocument, StorageError> {
        let mut doc = MemoryDocument::empty(self.clock.now());
        if let Some(agent) = agent {
            let version = RowVersion {
                revision: leased.revision,
                xmin: leased.xmin.clone(),
            };
            doc.facts = match self.cached(&scope_key(user, agent), &version) {
                Some(facts) => facts,
                None => {
                    let client = self.store.client().await.map_err(pool)?;
                    self.scope_facts(&client, user, agent, Some(version))
                        .await?
                }
            };
        }
        doc.version.clone_from(&leased.version);
        doc.revision = leased.revision;
        doc.last_updated.clone_from(&leased.last_updated);
        doc.user = leased.user.clone();
        doc.history = leased.history.clone();
        Ok(doc)
    }

    /// The user's row read for a cold load in lease mode, taking a lease on the bucket when
    /// the user has a committed revision (see [`GRANT_SQL`]).
    async fn grant(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        b: &str,
    ) -> Result<(Option<UserRow>, bool), StorageError> {
        let stmt = prepared(client, GRANT_SQL).await?;
        let hub = self.store.leases();
        let row = client
            .query_opt(&stmt, &[&b, &hub.holder(), &hub.lease().as_secs_f64()])
            .await
            .map_err(db("read the user and take a lease"))?;
        let Some(r) = row else {
            return Ok((None, false));
        };
        let revision: i64 = r.get(0);
        let granted: i64 = r.get(5);
        let row = UserRow {
            revision: u64::try_from(revision).map_err(|e| corrupt("revision", e))?,
            version: r.get(1),
            summaries: r.get(2),
            last_updated: r.get(3),
            xmin: r.get(4),
        };
        Ok((Some(row).filter(|r| r.revision > 0), granted > 0))
    }

    async fn facts_of(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<Vec<Fact>, StorageError> {
        let stmt = prepared(client, FACTS_SQL).await?;
        let rows = client
            .query(&stmt, &[&bucket(user), &agent.as_str()])
            .await
            .map_err(db("read the facts"))?;
        let now = self.clock.now();
        rows.iter()
            .map(|r| from_stored(r.get(0), user, now).map(|s| s.fact))
            .collect()
    }

    async fn commit_once(
        &self,
        user: Option<&UserId>,
        req: &CommitRequest,
    ) -> Result<ChangeResult, StorageError> {
        let now = self.clock.now();
        let b = bucket(user);
        let fence = self.store.leases().fence(b);
        let mut client = self.store.client().await.map_err(pool)?;
        let create = prepared(&client, CREATE_USER_SQL).await?;
        let locked = prepared(&client, USER_SQL_LOCKED).await?;
        let fenced = prepared(&client, FENCE_SQL).await?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(db("begin"))?;
        // One pipelined round trip: the row created when missing, locked and read, and the
        // other replicas' read leases on the bucket revoked under the lock.
        let (_, row, revoked) = tokio::try_join!(
            async {
                tx.execute(&create, &[&b])
                    .await
                    .map_err(db("create the user"))
            },
            user_row(&tx, &locked, b),
            async {
                fence
                    .revoke(&tx, &fenced)
                    .await
                    .map_err(db("revoke the read leases"))
            },
        )?;
        let record = row.as_ref().map(|r| CurrentRecord {
            revision: r.revision,
            needs_rewrite: false,
        });
        let mut stored: HashMap<FactId, StoredFact> = HashMap::new();
        if let Some(agent) = &req.agent {
            let ids: Vec<&str> = req
                .upserts
                .iter()
                .map(|(id, _)| id.as_str())
                .chain(req.deletes.iter().map(FactId::as_str))
                .collect();
            let rows = tx
                .query(
                    "SELECT id, fact::text FROM facts WHERE bucket = $1 AND agent = $2 \
                     AND id = ANY($3) FOR UPDATE",
                    &[&b, &agent.as_str(), &ids],
                )
                .await
                .map_err(db("read the named facts"))?;
            for r in &rows {
                let id = FactId::new(r.get::<_, &str>(0)).map_err(|e| corrupt("fact id", e))?;
                stored.insert(id, from_stored(r.get(1), user, now)?);
            }
        }
        let summaries = row.as_ref().map(|r| r.summaries.clone());
        let decided = commit::decide::<StorageError>(
            req,
            user.map(|u| u.as_str().to_owned()),
            record,
            |id| Ok(stored.remove(id)),
            || match &summaries {
                Some(text) => sections_from(text),
                None => Ok((
                    SummarySection::default_user(),
                    SummarySection::default_history(),
                )),
            },
            now,
        )?;
        let w = match decided {
            Decision::Unchanged => {
                let r = row.unwrap_or(UserRow {
                    revision: 0,
                    version: DOCUMENT_VERSION.into(),
                    summaries: String::new(),
                    last_updated: String::new(),
                    xmin: String::new(),
                });
                tx.rollback().await.map_err(db("end"))?;
                return Ok(ChangeResult {
                    version: r.version,
                    revision: r.revision,
                    last_updated: r.last_updated,
                    upserted_facts: Vec::new(),
                    deleted_fact_ids: Vec::new(),
                });
            }
            Decision::Write(w) => *w,
        };
        let written: Vec<Fact> = w.writes.into_iter().map(|d| d.fact).collect();
        if let Some(agent) = &req.agent {
            for f in &written {
                let revision = i64::try_from(f.revision).unwrap_or(i64::MAX);
                write_fact(&tx, (b, agent.as_str()), f, revision)
                    .await
                    .map_err(db("write a fact"))?;
            }
            if !w.removals.is_empty() {
                let ids: Vec<&str> = w.removals.iter().map(FactId::as_str).collect();
                tx.execute(
                    "DELETE FROM facts WHERE bucket = $1 AND agent = $2 AND id = ANY($3)",
                    &[&b, &agent.as_str(), &ids],
                )
                .await
                .map_err(db("delete facts"))?;
                let gone: Vec<String> = w.removals.iter().map(ToString::to_string).collect();
                forget_metadata(&tx, b, agent, Some(&gone)).await?;
            }
        }
        let last_updated = now.to_iso_z();
        write_user(
            &tx,
            b,
            i64::try_from(w.next_revision).unwrap_or(i64::MAX),
            &encode_sections(w.user.0, w.history.0),
            &last_updated,
        )
        .await
        .map_err(db("write the user"))?;
        // The holders answer once they see the commit: listen before it.
        fence.listen(&revoked).await;
        tx.commit().await.map_err(db("commit"))?;
        // Acknowledged only once no other replica can serve the bucket as it was.
        fence.settle(revoked).await;
        Ok(ChangeResult {
            version: DOCUMENT_VERSION.into(),
            revision: w.next_revision,
            last_updated,
            upserted_facts: written,
            deleted_fact_ids: w.removals,
        })
    }

    /// The scope's metadata row, created when missing (the user row must exist), locked.
    async fn metadata_row(
        tx: &impl GenericClient,
        b: &str,
        agent: &AgentName,
    ) -> Result<(Map<String, Value>, Value), StorageError> {
        tx.execute(
            "INSERT INTO users (bucket) VALUES ($1) ON CONFLICT (bucket) DO NOTHING",
            &[&b],
        )
        .await
        .map_err(db("create the user"))?;
        tx.execute(
            "INSERT INTO fact_metadata (bucket, agent) VALUES ($1, $2) \
             ON CONFLICT (bucket, agent) DO NOTHING",
            &[&b, &agent.as_str()],
        )
        .await
        .map_err(db("create the metadata"))?;
        let row = tx
            .query_one(
                "SELECT usage, audit FROM fact_metadata WHERE bucket = $1 AND agent = $2 \
                 FOR UPDATE",
                &[&b, &agent.as_str()],
            )
            .await
            .map_err(db("read the metadata"))?;
        let usage = match row.get::<_, Value>(0) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        Ok((usage, row.get(1)))
    }
}

async fn write_metadata(
    tx: &impl GenericClient,
    b: &str,
    agent: &AgentName,
    usage: Map<String, Value>,
    audit: Vec<Value>,
) -> Result<(), StorageError> {
    tx.execute(
        "UPDATE fact_metadata SET usage = $3, audit = $4 WHERE bucket = $1 AND agent = $2",
        &[
            &b,
            &agent.as_str(),
            &Value::Object(usage),
            &Value::Array(audit),
        ],
    )
    .await
    .map_err(db("write the metadata"))?;
    Ok(())
}

/// Removes `ids` (all with `None`) from the scope's usage and audit.
async fn forget_metadata(
    tx: &impl GenericClient,
    b: &str,
    agent: &AgentName,
    ids: Option<&[String]>,
) -> Result<(), StorageError> {
    let Some(ids) = ids else {
        tx.execute(
            "DELETE FROM fact_metadata WHERE bucket = $1 AND agent = $2",
            &[&b, &agent.as_str()],
        )
        .await
        .map_err(db("clear the metadata"))?;
        return Ok(());
    };
    let row = tx
        .query_opt(
            "SELECT usage, audit FROM fact_metadata WHERE bucket = $1 AND agent = $2 FOR UPDATE",
            &[&b, &agent.as_str()],
        )
        .await
        .map_err(db("read the metadata"))?;
    let Some(row) = row else { return Ok(()) };
    let mut usage = match row.get::<_, Value>(0) {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    metadata::forget_usage(&mut usage, ids);
    let audit = metadata::forget_audit(row.get(1), ids);
    write_metadata(tx, b, agent, usage, audit).await
}

#[async_trait]
impl FactRepository for PgStorage {
    /// The scope cache (`cache_max_scopes`) and the lease holder's tables.
    fn cache_bounds(&self) -> Vec<deermem_core::CacheBound> {
        let scopes = self.cache.lock().len();
        let mut out = vec![deermem_core::CacheBound::entries(
            "postgres.scopes",
            self.cache_max_scopes,
            Some(scopes),
        )];
        out.extend(self.store.leases().cache_bounds());
        out
    }

    fn capabilities(&self) -> StorageCapabilities {
        StorageCapabilities {
            names: [
                "postgres",
                "revision",
                "fact-repository",
                "substring-fallback",
                "retrieval",
            ]
            .into_iter()
            .map(str::to_owned)
            .collect(),
            persistent: true,
            retrieval: true,
        }
    }

    async fn load(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        let b = bucket(user);
        let leases = self.store.leases();
        let lease_mode = self.store.coherence() == Coherence::Lease;
        if lease_mode && let Some(leased) = leases.leased(b) {
            return self.load_leased(user, agent, &leased).await;
        }
        let client = self.store.client().await.map_err(pool)?;
        let mut doc = MemoryDocument::empty(self.clock.now());
        // A lease is only taken while this replica listens for revocations.
        let ticket = if lease_mode {
            leases.begin_grant()
        } else {
            None
        };
        let (row, granted) = match &ticket {
            Some(_) => self.grant(&client, b).await?,
            None => {
                let stmt = prepared(&client, USER_SQL).await?;
                (user_row(&**client, &stmt, b).await?, false)
            }
        };
        let version = row.as_ref().map(|r| RowVersion {
            revision: r.revision,
            xmin: r.xmin.clone(),
        });
        if let Some(agent) = agent {
            doc.facts = self.scope_facts(&client, user, agent, version).await?;
        }
        if let Some(r) = row {
            let (u, h) = sections_from(&r.summaries)?;
            if let Some(ticket) = ticket.as_ref().filter(|_| granted) {
                leases.install(
                    b,
                    ticket,
                    LeasedUser {
                        revision: r.revision,
                        version: r.version.clone(),
                        last_updated: r.last_updated.clone(),
                        xmin: r.xmin.clone(),
                        user: u.clone(),
                        history: h.clone(),
                    },
                );
            }
            doc.version = r.version;
            doc.revision = r.revision;
            doc.last_updated = r.last_updated;
            doc.user = u;
            doc.history = h;
        }
        Ok(doc)
    }

    async fn reload(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
    ) -> Result<MemoryDocument, StorageError> {
        self.load(user, agent).await
    }

    async fn get_fact(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        id: &FactId,
    ) -> Result<Option<Fact>, StorageError> {
        let client = self.store.client().await.map_err(pool)?;
        let row = client
            .query_opt(
                "SELECT fact::text FROM facts WHERE bucket = $1 AND agent = $2 AND id = $3",
                &[&bucket(user), &agent.as_str(), &id.as_str()],
            )
            .await
            .map_err(db("read a fact"))?;
        row.map(|r| from_stored(r.get(0), user, self.clock.now()).map(|s| s.fact))
            .transpose()
    }

    async fn list_facts(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        query: &ListQuery,
    ) -> Result<Vec<Fact>, StorageError> {
        if query.limit == Some(0) {
            return query.apply(Vec::new());
        }
        let client = self.store.client().await.map_err(pool)?;
        query.apply(self.facts_of(&client, user, agent).await?)
    }

    async fn apply_changes(
        &self,
        user: Option<&UserId>,
        agent: Option<&AgentName>,
        changes: ChangeSet,
        options: ApplyOptions,
    ) -> Result<ChangeResult, StorageError> {
        let mut req = CommitRequest::prepare(changes, agent, fresh_id)?;
        req.expected_revision = options.expected_manifest_revision;
        let can_rebase = commit::may_rebase(&req, options.allow_manifest_rebase);
        let mut attempt = 1;
        loop {
            match self.commit_once(user, &req).await {
                Err(StorageError::ManifestConflict { found, .. })
                    if can_rebase && attempt < MAX_ATTEMPTS =>
                {
                    req.expected_revision = Some(found);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn new_fact_id(&self) -> FactId {
        fresh_id()
    }

    async fn clear_all(&self, user: Option<&UserId>) -> Result<MemoryDocument, StorageError> {
        let agents: Vec<String> = {
            let client = self.store.client().await.map_err(pool)?;
            client
                .query(
                    "SELECT DISTINCT agent FROM facts WHERE bucket = $1 \
                     UNION SELECT agent FROM fact_metadata WHERE bucket = $1 ORDER BY 1",
                    &[&bucket(user)],
                )
                .await
                .map_err(db("list the agents"))?
                .iter()
                .map(|r| r.get(0))
                .collect()
        };
        for a in agents {
            let agent = AgentName::parse(&a).map_err(|e| corrupt("agent name", e))?;
            let ids: Vec<FactId> = self
                .load(user, Some(&agent))
                .await?
                .facts
                .into_iter()
                .map(|f| f.id)
                .collect();
            if !ids.is_empty() {
                self.apply_changes(
                    user,
                    Some(&agent),
                    ChangeSet {
                        deletes: ids,
                        ..ChangeSet::default()
                    },
                    ApplyOptions::default(),
                )
                .await?;
            }
            self.clear_fact_metadata(user, &agent, None).await?;
        }
        self.apply_changes(
            user,
            None,
            ChangeSet {
                summaries: Some(SummaryPatch {
                    user: Some(SummarySection::default_user().0),
                    history: Some(SummarySection::default_history().0),
                }),
                ..ChangeSet::default()
            },
            ApplyOptions::default(),
        )
        .await?;
        self.load(user, Some(&AgentName::default_bucket())).await
    }

    /// Releases this replica's read leases (their rows deleted), so that a write on another
    /// replica does not wait for a holder that stopped.
    async fn close(&self) {
        if let Err(e) = self.store.release_leases().await {
            tracing::warn!(error = %e, "PostgreSQL: the read leases could not be released; they run out on their own");
        }
    }
}

#[async_trait]
impl FactMetadata for PgStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> Result<FactUsageMap, StorageError> {
        let client = self.store.client().await.map_err(pool)?;
        let row = client
            .query_opt(
                "SELECT usage FROM fact_metadata WHERE bucket = $1 AND agent = $2",
                &[&bucket(user), &agent.as_str()],
            )
            .await
            .map_err(db("read the usage"))?;
        Ok(metadata::usage_from_value(row.map(|r| r.get(0))))
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        if ids.is_empty() {
            return Ok(());
        }
        let b = bucket(user);
        let mut client = self.store.client().await.map_err(pool)?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(db("begin"))?;
        let wanted: Vec<&str> = ids.iter().map(FactId::as_str).collect();
        let found: std::collections::HashSet<String> = tx
            .query(
                "SELECT id FROM facts WHERE bucket = $1 AND agent = $2 AND id = ANY($3)",
                &[&b, &agent.as_str(), &wanted],
            )
            .await
            .map_err(db("read the facts"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut seen = std::collections::HashSet::new();
        let existing: Vec<String> = wanted
            .iter()
            .filter(|id| found.contains(**id) && seen.insert(**id))
            .map(|id| (*id).to_owned())
            .collect();
        if existing.is_empty() {
            return Ok(());
        }
        let (mut usage, audit) = Self::metadata_row(&tx, b, agent).await?;
        let now = at.unwrap_or_else(|| self.clock.now());
        metadata::record_accesses(&mut usage, &existing, now, self.half_life_days);
        let audit = match audit {
            Value::Array(a) => a,
            _ => Vec::new(),
        };
        write_metadata(&tx, b, agent, usage, audit).await?;
        tx.commit().await.map_err(db("commit"))
    }

    async fn record_capacity_eviction(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: &EvictionDecision,
        max_facts: usize,
        shadow: Option<&EvictionDecision>,
        at: Option<Timestamp>,
    ) -> Result<(), StorageError> {
        if decision.evicted.is_empty() || self.audit_max_entries == 0 {
            return Ok(());
        }
        let b = bucket(user);
        let mut client = self.store.client().await.map_err(pool)?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(db("begin"))?;
        let (usage, audit) = Self::metadata_row(&tx, b, agent).await?;
        let mut events = match audit {
            Value::Array(a) => a,
            _ => Vec::new(),
        };
        let now = at.unwrap_or_else(|| self.clock.now());
        metadata::append_eviction(
            &mut events,
            decision,
            max_facts,
            shadow,
            now,
            self.audit_max_entries,
        );
        write_metadata(&tx, b, agent, usage, events).await?;
        tx.commit().await.map_err(db("commit"))
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> Result<(), StorageError> {
        let mut client = self.store.client().await.map_err(pool)?;
        let raw: &mut tokio_postgres::Client = &mut client;
        let tx = raw.transaction().await.map_err(db("begin"))?;
        let ids: Option<Vec<String>> = ids.map(|i| i.iter().map(ToString::to_string).collect());
        forget_metadata(&tx, bucket(user), agent, ids.as_deref()).await?;
        tx.commit().await.map_err(db("commit"))
    }
}

#[async_trait]
impl ScopedSearch for PgStorage {
    async fn search_facts(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        if query.is_trivially_empty() {
            return Ok(Vec::new());
        }
        let category = query.category.as_deref();
        if category.is_some_and(|c| c.contains('\0')) {
            return Err(StorageError::invalid(
                "category",
                "a search category cannot contain a NUL character",
            ));
        }
        let Some(plan) = search::plan(&query.text) else {
            return self.substring_search(query).await;
        };
        let client = self.store.client().await.map_err(pool)?;
        let per_scope = query.top_k.saturating_mul(4);
        let now = self.clock.now();
        let mut all: Vec<Scored> = Vec::new();
        let mut seen: Vec<&Scope> = Vec::new();
        for scope in &query.scopes {
            let Some(agent) = &scope.agent else { continue };
            if seen.contains(&scope) {
                continue;
            }
            seen.push(scope);
            let user = scope.user.as_ref();
            let found = search::scope_candidates(
                &client,
                Table::Facts,
                (bucket(user), agent.as_str()),
                &plan,
                category,
                per_scope,
            )
            .await
            .map_err(db("search"))?;
            let mut scored = Vec::with_capacity(found.len());
            for c in &found {
                let fact = from_stored(&c.fact, user, now)?.fact;
                scored.push(Scored::new(c, fact, now));
            }
            all.extend(search::cut_scope(scored, per_scope));
        }
        Ok(search::finish(all, query.top_k))
    }

    async fn rebuild_index(
        &self,
        scopes: Option<&[(Option<UserId>, AgentName)]>,
    ) -> Result<RebuildReport, StorageError> {
        // The search columns are written with every fact, so there is normally nothing to
        // do: a rebuild recomputes them from the stored facts and rewrites only those that
        // differ (after an upgrade that changes the text rule, say). It takes no lock: a row
        // is rewritten only while it still holds the revision that was read, so a concurrent
        // commit's columns are never replaced by older ones.
        let mut report = RebuildReport {
            supported: true,
            ..RebuildReport::default()
        };
        let now = self.clock.now();
        let client = self.store.client().await.map_err(pool)?;
        let rows = match scopes {
            None => client
                .query(
                    "SELECT bucket, agent, id, revision, fact::text, category, search_text, \
                     search_tokens FROM facts",
                    &[],
                )
                .await
                .map_err(db("read the facts"))?,
            Some(list) => {
                let mut rows = Vec::new();
                for (u, a) in list {
                    rows.extend(
                        client
                            .query(
                                "SELECT bucket, agent, id, revision, fact::text, category, \
                                 search_text, search_tokens FROM facts \
                                 WHERE bucket = $1 AND agent = $2",
                                &[&bucket(u.as_ref()), &a.as_str()],
                            )
                            .await
                            .map_err(db("read the facts"))?,
                    );
                }
                rows
            }
        };
        for r in &rows {
            let (b, agent, id, revision): (&str, &str, &str, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let fact = match from_stored(r.get(4), None, now) {
                Ok(s) => s.fact,
                Err(e) => {
                    tracing::warn!(bucket = %b, agent = %agent, id, error = %e,
                        "a stored fact does not decode; its search columns are left as they are");
                    report.failed += 1;
                    continue;
                }
            };
            let ix = search::indexed(&fact);
            let current = (r.get::<_, &str>(5), r.get::<_, &str>(6), r.get::<_, i32>(7));
            if current != (ix.category.as_str(), ix.text.as_str(), ix.tokens) {
                client
                    .execute(
                        "UPDATE facts SET category = $5, search_text = $6, search_tokens = $7 \
                         WHERE bucket = $1 AND agent = $2 AND id = $3 AND revision = $4",
                        &[
                            &b,
                            &agent,
                            &id,
                            &revision,
                            &ix.category,
                            &ix.text,
                            &ix.tokens,
                        ],
                    )
                    .await
                    .map_err(db("index a fact"))?;
            }
            report.indexed += 1;
        }
        Ok(report)
    }

    async fn retrieval_status(&self) -> RetrievalStatus {
        let mut status = RetrievalStatus {
            configured: true,
            mode: "external".into(),
            adapter: Some(crate::KIND.into()),
            ..RetrievalStatus::default()
        };
        let counted = match self.store.client().await {
            Ok(client) => client
                .query_one("SELECT count(*) FROM facts", &[])
                .await
                .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0))
                .map_err(|e| format!("PostgreSQL: count the facts: {e}")),
            Err(e) => Err(format!("PostgreSQL: take a connection: {e}")),
        };
        match counted {
            Ok(n) => status.total_docs = Some(n),
            Err(e) => status.last_error = Some(e),
        }
        status
    }
}

impl PgStorage {
    /// Search without the index (a query with no indexable term): the storage's substring
    /// rules over the scopes' facts, as the file store answers without an index.
    async fn substring_search(&self, query: &SearchQuery) -> Result<Vec<SearchHit>, StorageError> {
        let mut facts = Vec::new();
        for scope in &query.scopes {
            let Some(agent) = &scope.agent else { continue };
            facts.extend(self.load(scope.user.as_ref(), Some(agent)).await?.facts);
        }
        Ok(substring_hits(&facts, query, SubstringRules::STORAGE))
    }
}
