//! Read leases: how a replica serves a user's row and cached facts without a round trip and
//! still never serves a scope older than a write another replica has acknowledged.
//!
//! Each [`crate::PgDatabase`] (one per replica) is a *holder* with a random id and one dedicated
//! connection, outside the pool, that `LISTEN`s on the channel `deermem_<holder>`. A cold read
//! takes a lease on the user's bucket in the statement that reads the user's row (the row
//! `FOR SHARE`, the lease row upserted with `expires_at = now() + d`); the lease is valid here
//! until `t0 + d × (1 − margin)`, `t0` taken before the statement was sent. A warm read with a
//! valid lease runs no statement.
//!
//! A write goes through [`Fence`]: in its transaction, `deermem_fence` (schema version 5) locks
//! the user's row, deletes the other holders' leases of the bucket and notifies each of them
//! (delivered at commit) with the writer's id, a token and the bucket; after `COMMIT` the
//! writer waits until each holder has answered (a holder first drops its lease, then notifies
//! the writer's channel) or the lease's remaining time has passed. The argument is written
//! out in `docs/postgres.md`.
//!
//! When the dedicated connection fails, every lease is dropped at once and reads go back to
//! checking the user's row on every load until it is listening again.
//!
//! No write waits on a holder that is alive and answering: a writer that revoked leases is
//! listening before it commits (its own listener is brought up first, see
//! [`LeaseHub::wait_listening`]), so no answer is sent to a channel nobody hears. A holder
//! deletes its own lease rows when its store is closed ([`LeaseHub::release`]), and the
//! listener sweeps rows whose lease has run out, so neither an exited process nor an old
//! row delays a write.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use deermem_core::SummarySection;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, watch};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, GenericClient, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The part of a lease's length a holder does not count on (its clock and the database's may
/// run at slightly different rates; the database's clock may be slewed).
const MARGIN: f64 = 0.25;

/// Buckets remembered as revoked (for grants in flight) before the memory starts over.
const MAX_REMEMBERED: usize = 8192;

/// Leases held at most (past it they start over).
const MAX_LEASES: usize = 8192;

/// How often a listening holder deletes the lease rows (anyone's) that have run out.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The first wait before connecting the listener again, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// Counters of the lease machinery, for tests and operators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Loads served under a valid lease without reading the user's row.
    pub warm_reads: u64,
    /// Leases granted (cold reads that took one).
    pub grants: u64,
    /// Revocations received from writers (each answered).
    pub revocations: u64,
    /// Writes that revoked at least one other holder's lease.
    pub fenced_writes: u64,
    /// Holders a write stopped waiting for because their lease ran out unanswered.
    pub expired_waits: u64,
    /// Times the dedicated connection started listening.
    pub listens: u64,
}

/// The user's row as a lease serves it.
#[derive(Clone, Debug)]
pub(crate) struct LeasedUser {
    pub(crate) revision: u64,
    pub(crate) version: String,
    pub(crate) last_updated: String,
    pub(crate) xmin: String,
    pub(crate) user: SummarySection,
    pub(crate) history: SummarySection,
}

/// How the dedicated connection is opened: the pool's settings, with or without TLS.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls: Option<MakeRustlsConnect>,
}

/// The holder's state shared by every clone of its store.
pub(crate) struct LeaseHub {
    holder: String,
    lease: Duration,
    /// Lease mode: the listener starts with the first read or write. Otherwise (revision
    /// checks) only when a write finds leases of other holders to revoke.
    eager: bool,
    connector: Connector,
    state: Mutex<State>,
    /// Dropped with the hub: the listener task sees it and stops.
    stop: watch::Sender<()>,
    stats: Mutex<LeaseStats>,
    /// Woken whenever the listener starts or stops listening.
    changed: Notify,
    /// A test hook: how long the listener waits before handling a revocation (a slow holder).
    revocation_delay_ms: AtomicU64,
}

#[derive(Default)]
struct State {
    listener: Listener,
    /// Changes whenever the listener starts or stops listening: a grant begun under one
    /// generation is not installed under another.
    generation: u64,
    /// Orders grants and revocations.
    seq: u64,
    /// Grants begun at or before this were begun before the revocation memory started over.
    floor: u64,
    /// The `seq` of the latest revocation of each bucket.
    revoked_at: HashMap<String, u64>,
    leases: HashMap<String, Lease>,
    waiters: HashMap<u64, Arc<Waiter>>,
    next_token: u64,
    retry_wait: Duration,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Listener {
    /// Not started, or stopped; may start at `retry_after`.
    #[default]
    Idle,
    Retry(Instant),
    Starting,
    Up,
}

struct Lease {
    until: Instant,
    generation: u64,
    row: Arc<LeasedUser>,
}

/// A grant in flight: what it must still match when it is installed.
pub(crate) struct Ticket {
    seq: u64,
    generation: u64,
    t0: Instant,
}

#[derive(Default)]
struct Waiter {
    acked: Mutex<HashSet<String>>,
    notify: Notify,
}

impl LeaseHub {
    /// The bounds of the holder's tables: the leases it holds and the revocations it
    /// remembers (reported in `GET /api/memory/status`).
    pub(crate) fn cache_bounds(&self) -> [deermem_core::CacheBound; 2] {
        let state = self.state.lock();
        [
            deermem_core::CacheBound::entries(
                "postgres.leases",
                MAX_LEASES,
                Some(state.leases.len()),
            ),
            deermem_core::CacheBound::entries(
                "postgres.revocations",
                MAX_REMEMBERED,
                Some(state.revoked_at.len()),
            ),
        ]
    }

    pub(crate) fn new(lease: Duration, eager: bool, mut connector: Connector) -> Arc<Self> {
        let (stop, _) = watch::channel(());
        let holder = uuid::Uuid::new_v4().simple().to_string();
        // Operators (and tests) find a replica's listener by its application name.
        connector
            .pg
            .application_name(format!("deermem-lease-{holder}"));
        Arc::new(Self {
            holder,
            lease,
            eager,
            connector,
            state: Mutex::new(State {
                retry_wait: RETRY_FIRST,
                ..State::default()
            }),
            stop,
            changed: Notify::new(),
            stats: Mutex::new(LeaseStats::default()),
            revocation_delay_ms: AtomicU64::new(0),
        })
    }

    /// This holder's id.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// The lease length asked of the database.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    pub(crate) fn stats(&self) -> LeaseStats {
        *self.stats.lock()
    }

    pub(crate) fn set_revocation_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.revocation_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// The leased row of `bucket` when a lease on it is valid now.
    pub(crate) fn leased(&self, bucket: &str) -> Option<Arc<LeasedUser>> {
        let state = self.state.lock();
        let lease = state.leases.get(bucket)?;
        let valid = state.listener == Listener::Up
            && lease.generation == state.generation
            && Instant::now() < lease.until;
        if !valid {
            return None;
        }
        let row = Arc::clone(&lease.row);
        drop(state);
        self.stats.lock().warm_reads += 1;
        Some(row)
    }

    /// Starts a grant: `None` while the listener is not listening (the read then takes no
    /// lease, and the listener is started).
    pub(crate) fn begin_grant(self: &Arc<Self>) -> Option<Ticket> {
        let mut state = self.state.lock();
        if state.listener != Listener::Up {
            drop(state);
            self.ensure_listener();
            return None;
        }
        state.seq += 1;
        Some(Ticket {
            seq: state.seq,
            generation: state.generation,
            t0: Instant::now(),
        })
    }

    /// Installs the lease a grant begun with `ticket` obtained, unless the bucket was revoked
    /// or the listener stopped since the ticket was taken.
    pub(crate) fn install(&self, bucket: &str, ticket: &Ticket, row: LeasedUser) {
        let until = ticket.t0 + self.lease.mul_f64(1.0 - MARGIN);
        let mut state = self.state.lock();
        let revoked = ticket.seq <= state.floor
            || state
                .revoked_at
                .get(bucket)
                .is_some_and(|&at| at > ticket.seq);
        if revoked || ticket.generation != state.generation || state.listener != Listener::Up {
            return;
        }
        if state.leases.len() >= MAX_LEASES && !state.leases.contains_key(bucket) {
            state.leases.clear();
        }
        state.leases.insert(
            bucket.to_owned(),
            Lease {
                until,
                generation: ticket.generation,
                row: Arc::new(row),
            },
        );
        drop(state);
        self.stats.lock().grants += 1;
    }

    /// Drops the lease on `bucket` here (a revocation, or this holder's own write) and makes
    /// every grant of it in flight void.
    pub(crate) fn revoke_local(&self, bucket: &str) {
        let mut state = self.state.lock();
        state.seq += 1;
        let seq = state.seq;
        if state.revoked_at.len() >= MAX_REMEMBERED && !state.revoked_at.contains_key(bucket) {
            state.revoked_at.clear();
            state.floor = seq;
        }
        state.revoked_at.insert(bucket.to_owned(), seq);
        state.leases.remove(bucket);
    }

    /// Starts the listener task unless it runs or is waiting to retry (needs a tokio
    /// runtime; without one nothing is started and reads take no lease).
    pub(crate) fn ensure_listener(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut state = self.state.lock();
            match state.listener {
                Listener::Starting | Listener::Up => return,
                Listener::Retry(at) if Instant::now() < at => return,
                Listener::Idle | Listener::Retry(_) => state.listener = Listener::Starting,
            }
        }
        let hub = Arc::downgrade(self);
        let stop = self.stop.subscribe();
        let Connector { pg, tls } = self.connector.clone();
        let channel = self.channel();
        match tls {
            None => runtime.spawn(listen(hub, pg, tokio_postgres::NoTls, channel, stop)),
            Some(tls) => runtime.spawn(listen(hub, pg, tls, channel, stop)),
        };
    }

    fn channel(&self) -> String {
        channel_of(&self.holder)
    }

    /// Starts the listener unless it runs and waits, at most `within`, until it listens.
    /// Returns whether it does (false: it could not connect, or is waiting to retry).
    pub(crate) async fn wait_listening(self: &Arc<Self>, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        self.ensure_listener();
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.state.lock().listener {
                Listener::Up => return true,
                Listener::Starting => {}
                Listener::Idle | Listener::Retry(_) => return false,
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Gives up every lease of this holder: none is served here any more, and its rows are
    /// deleted so that no writer waits for them (a process exiting, a store closed). Later
    /// reads take leases again.
    pub(crate) async fn release(
        &self,
        client: &impl GenericClient,
    ) -> Result<u64, tokio_postgres::Error> {
        {
            let mut state = self.state.lock();
            state.generation += 1;
            state.seq += 1;
            state.floor = state.seq;
            state.revoked_at.clear();
            state.leases.clear();
        }
        client
            .execute(
                "DELETE FROM scope_leases WHERE holder = $1",
                &[&self.holder],
            )
            .await
    }

    fn listening(&self) {
        let mut state = self.state.lock();
        state.listener = Listener::Up;
        state.generation += 1;
        state.retry_wait = RETRY_FIRST;
        drop(state);
        self.changed.notify_waiters();
        self.stats.lock().listens += 1;
        tracing::debug!(holder = %self.holder, "PostgreSQL lease listener listening");
    }

    /// The listener stopped (or never started): every lease goes, grants in flight are void.
    fn stopped(&self) {
        let mut state = self.state.lock();
        state.generation += 1;
        state.leases.clear();
        let wait = state.retry_wait;
        state.retry_wait = (wait * 2).min(RETRY_MAX);
        state.listener = Listener::Retry(Instant::now() + wait);
        drop(state);
        self.changed.notify_waiters();
    }

    /// A message on this holder's channel: a revocation (answered with the reply returned) or
    /// a holder's answer to one of this holder's writes.
    fn on_message(&self, payload: &str) -> Option<(String, String)> {
        let mut parts = payload.splitn(4, ' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("r"), Some(writer), Some(token), Some(bucket)) => {
                self.revoke_local(bucket);
                self.stats.lock().revocations += 1;
                Some((channel_of(writer), format!("a {} {}", self.holder, token)))
            }
            (Some("a"), Some(holder), Some(token), None) => {
                let token: u64 = token.parse().ok()?;
                let waiter = self.state.lock().waiters.get(&token).cloned();
                if let Some(w) = waiter {
                    w.acked.lock().insert(holder.to_owned());
                    w.notify.notify_one();
                }
                None
            }
            _ => {
                tracing::warn!(holder = %self.holder, "an unknown message on the lease channel");
                None
            }
        }
    }

    /// A fence for a write to `bucket`: register it before the write's transaction.
    pub(crate) fn fence(self: &Arc<Self>, bucket: &str) -> Fence {
        if self.eager {
            // Answers to this write can only reach a listening channel (see
            // [`Fence::listen`] for the wait before the commit).
            self.ensure_listener();
        }
        let waiter = Arc::new(Waiter::default());
        let token = {
            let mut state = self.state.lock();
            state.next_token += 1;
            let token = state.next_token;
            state.waiters.insert(token, Arc::clone(&waiter));
            token
        };
        Fence {
            hub: Arc::clone(self),
            bucket: bucket.to_owned(),
            token,
            waiter,
        }
    }
}

fn channel_of(holder: &str) -> String {
    format!("deermem_{holder}")
}

/// A write's revocation of the other holders' leases on one bucket. Call [`Fence::revoke`] in
/// the write's transaction, commit, then [`Fence::settle`] before acknowledging the write.
pub(crate) struct Fence {
    hub: Arc<LeaseHub>,
    bucket: String,
    token: u64,
    waiter: Arc<Waiter>,
}

/// What a fence revoked: each other holder and how long its lease still had to run.
#[must_use = "a write must settle its revocations before it is acknowledged"]
pub(crate) struct Revoked(Vec<(String, Duration)>);

impl Fence {
    /// Before the commit of a write that revoked leases: makes sure this holder listens, so
    /// that the holders' answers (sent once they see the commit) are heard and the write does
    /// not wait out their leases. Bounded by the lease length (past it, waiting for the
    /// leases to end costs no more).
    pub(crate) async fn listen(&self, revoked: &Revoked) {
        if !revoked.0.is_empty() {
            self.hub.wait_listening(self.hub.lease).await;
        }
    }

    /// Locks the user's row (it must exist), revokes the other holders' leases on the bucket
    /// and notifies them (at commit), and drops this holder's own lease on it.
    pub(crate) async fn revoke(
        &self,
        tx: &impl GenericClient,
        statement: &tokio_postgres::Statement,
    ) -> Result<Revoked, tokio_postgres::Error> {
        let payload = format!("r {} {} {}", self.hub.holder, self.token, self.bucket);
        let rows = tx
            .query(statement, &[&self.bucket, &self.hub.holder, &payload])
            .await?;
        // Held under the row lock: a read of this holder's from now on waits for the commit.
        self.hub.revoke_local(&self.bucket);
        Ok(Revoked(
            rows.iter()
                .map(|r| {
                    let ms: f64 = r.get(1);
                    let left = if ms.is_finite() && ms > 0.0 {
                        Duration::from_secs_f64(ms / 1000.0)
                    } else {
                        Duration::ZERO
                    };
                    (r.get::<_, String>(0), left)
                })
                .collect(),
        ))
    }

    /// After the commit: waits until each revoked holder has answered or its lease has run
    /// out. Only then may the write be acknowledged.
    pub(crate) async fn settle(self, revoked: Revoked) {
        let Revoked(holders) = revoked;
        if holders.is_empty() {
            return;
        }
        self.hub.stats.lock().fenced_writes += 1;
        // Answers can only come to a listening channel; without one, the wait is the lease's.
        self.hub.ensure_listener();
        let start = Instant::now();
        let mut pending: Vec<(String, Instant)> = holders
            .into_iter()
            .map(|(h, left)| (h, start + left))
            .collect();
        loop {
            let now = Instant::now();
            {
                let acked = self.waiter.acked.lock();
                pending.retain(|(h, _)| !acked.contains(h));
            }
            let before = pending.len();
            pending.retain(|(_, until)| *until > now);
            let expired = before - pending.len();
            if expired > 0 {
                self.hub.stats.lock().expired_waits += expired as u64;
            }
            let Some(next) = pending.iter().map(|(_, until)| *until).min() else {
                return;
            };
            let _ = tokio::time::timeout_at(next.into(), self.waiter.notify.notified()).await;
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.hub.state.lock().waiters.remove(&self.token);
    }
}

/// The statement every write's fence runs (prepare it on the write's connection).
pub(crate) const FENCE_SQL: &str = "SELECT holder, remaining_ms FROM deermem_fence($1, $2, $3)";

/// The statement of a cold read in lease mode: the user's row read `FOR SHARE` (so it waits for
/// a writer holding it `FOR UPDATE`, then reads what that writer committed) and this holder's
/// lease on the bucket upserted, when the user has a committed revision.
pub(crate) const GRANT_SQL: &str = "WITH u AS (SELECT revision, version, summaries::text AS s, \
     coalesce(last_updated, '') AS lu, xmin::text AS x FROM users WHERE bucket = $1 FOR SHARE), \
     l AS (INSERT INTO scope_leases (bucket, holder, expires_at) \
     SELECT $1, $2, now() + make_interval(secs => $3::float8) FROM u WHERE u.revision > 0 \
     ON CONFLICT (bucket, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at RETURNING 1) \
     SELECT revision, version, s, lu, x, (SELECT count(*) FROM l) FROM u";

/// One session of the dedicated connection: connect, `LISTEN`, then answer revocations and
/// collect answers until the connection fails or the hub is dropped.
async fn listen<T>(
    hub: Weak<LeaseHub>,
    pg: tokio_postgres::Config,
    tls: T,
    channel: String,
    mut stop: watch::Receiver<()>,
) where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    // Whatever ends this session (an error, the hub dropped, the runtime shutting down) marks
    // the listener stopped, which drops every lease.
    struct Stopped(Weak<LeaseHub>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            if let Some(hub) = self.0.upgrade() {
                hub.stopped();
            }
        }
    }
    let _stopped = Stopped(hub.clone());
    let (client, mut connection) = match pg.connect(tls).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "PostgreSQL lease listener cannot connect; reads check the user's row meanwhile");
            return;
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let driver = async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n.payload().to_owned()).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "PostgreSQL lease listener lost its connection; leases dropped");
                    return;
                }
                None => return,
            }
        }
    };
    let handler = async {
        let quoted = format!("LISTEN \"{channel}\"");
        client.batch_execute(&quoted).await?;
        let answer = client.prepare("SELECT pg_notify($1, $2)").await?;
        let sweep = client
            .prepare("DELETE FROM scope_leases WHERE expires_at < now()")
            .await?;
        match hub.upgrade() {
            Some(h) => h.listening(),
            None => return Ok(()),
        }
        let mut sweeps = tokio::time::interval(SWEEP_EVERY);
        sweeps.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let payload = tokio::select! {
                p = rx.recv() => p,
                _ = sweeps.tick() => {
                    // A row whose lease has run out serves nothing: its holder stopped
                    // trusting it before `expires_at` (the margin).
                    client.execute(&sweep, &[]).await?;
                    continue;
                }
            };
            let Some(payload) = payload else { break };
            let Some(h) = hub.upgrade() else {
                return Ok(());
            };
            let delay = h.revocation_delay_ms.load(Ordering::Relaxed);
            if delay > 0 && payload.starts_with("r ") {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if let Some((to, reply)) = h.on_message(&payload) {
                drop(h);
                client.execute(&answer, &[&to, &reply]).await?;
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    };
    tokio::select! {
        () = driver => {}
        r = handler => {
            if let Err(e) = r {
                tracing::warn!(error = %e, "PostgreSQL lease listener failed; leases dropped");
            }
        }
        _ = stop.changed() => {}
    }
}
