//! Plumbing shared by DeerMem's remote adapters (the Honcho and OpenViking backends and the
//! OpenAI-compatible model client), written once:
//!
//! - [`http`]: the reqwest client every adapter builds, one HTTP exchange with a bounded body
//!   read and the server's `Retry-After`, path-segment encoding, a key (the core's
//!   `ConfigSecret`) as a sensitive `Bearer` header ([`http::bearer`]) and secret-free error
//!   text.
//! - [`retry`]: bounded retries on `backon`, exponential backoff with jitter, a server's
//!   `Retry-After` honoured up to a cap, and an injectable [`Sleeper`].
//! - [`base_url`]: the one base-URL and transport rule (an `http(s)` URL with a host, no
//!   credentials, query or fragment; a secret over plain `http` only where allowed).
//! - [`files`]: the cursor files, the file implementation of the core's cursor-store port
//!   (`deermem_core::ports::CursorStorage`, bounded reads, atomic durable writes), and the
//!   sequence digest the capture cursors share.
//! - [`KeyedLocks`]: async locks by key, held weakly.
//! - [`InFlight`]: counts queued and running operations, for a shutdown that waits for them.
//! - [`FailurePolicy`]: what a failed remote call does (fail open, or report the error);
//!   [`FailureLog`]: the last failure reaching the server, for the status.
//! - [`remote_fact`]: a remote search hit as the port's `PublicFact`.
//!
//! It is adapter support: of the DeerMem crates it depends on the core only, and adapters use
//! it without depending on each other.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

pub mod base_url;
mod failures;
pub mod files;
mod hit;
pub mod http;
mod in_flight;
mod locks;
mod policy;
pub mod retry;

pub use failures::FailureLog;
pub use hit::{RemoteHit, own_ranking_only, remote_fact};
pub use in_flight::{InFlight, InFlightGuard};
pub use locks::KeyedLocks;
pub use policy::FailurePolicy;
pub use retry::{RetryPolicy, Sleeper, TokioSleeper};
