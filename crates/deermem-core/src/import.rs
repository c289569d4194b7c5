//! The bound on import documents: at most [`MAX_IMPORT_FACTS`] facts. The engine enforces it on
//! every document; the hosts that read import text (the gateway, the CLI) check it on the raw
//! JSON first, before any fact is built (`deermem::import_fact_count`).

/// The most facts one import document may hold (all entry points: HTTP, CLI, Python).
///
/// Four times the largest `max_facts` a configuration accepts (500): an export of any bucket
/// fits, with room for merged exports the capacity policy then trims. Larger documents are
/// refused before their facts are built, because building them costs several kilobytes per fact
/// while at most `max_facts` are kept.
pub const MAX_IMPORT_FACTS: usize = 2000;
