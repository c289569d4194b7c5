//! The reliability and security suite (see `docs/reliability.md`): crash consistency under
//! SIGKILL, injected I/O faults, multi-process concurrency, gateway load, memory floods against
//! the real server, Python interoperability, the fuzz targets on their corpora, hostile input
//! and isolation on every surface, and resource limits. The CI subset runs by default;
//! `DEERMEM_LONG=1` runs the long versions.

mod concurrency;
mod crash;
mod faults;
mod floods;
mod fuzz_corpus;
mod gateway_load;
mod interop;
mod isolation;
mod limits;
mod support;
