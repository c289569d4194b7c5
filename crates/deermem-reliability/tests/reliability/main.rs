//! The reliability and security suite (see `docs/reliability.md`): crash consistency under
//! SIGKILL, injected I/O faults, multi-process concurrency, gateway load, Python
//! interoperability, the fuzz targets on their corpora, hostile input and isolation on every
//! surface, resource limits, and hostile clients and memory floods against the `deermem`
//! binary (stalled connections, SIGTERM, oversized imports, large turns). The CI subset runs by
//! default; `DEERMEM_LONG=1` runs the long versions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod concurrency;
mod crash;
mod faults;
mod floods;
mod frontend_parity;
mod fuzz_corpus;
mod gateway_load;
mod hostile_clients;
mod interop;
mod isolation;
mod limits;
mod replicas;
mod support;
mod turns;
