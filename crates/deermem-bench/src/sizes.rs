//! Workload sizes: the full run the targets are defined for, `--quick` (about ten times
//! smaller) and `--smoke` (a handful of operations each, for the CI test).

use serde_json::{Value, json};

/// How big each workload is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// The preset name (`full`, `quick`, `smoke`).
    pub preset: &'static str,
    /// `fsync_floor`: simulated commits.
    pub fsync_floor: usize,
    /// `write_fact`: sequential single-fact creates.
    pub write_fact: usize,
    /// `write_fact_parallel`: creates in total.
    pub write_parallel: usize,
    /// `write_fact_parallel`: concurrent writers (one user each).
    pub writers: usize,
    /// Facts in the scope the load, context, update and gateway workloads read.
    pub scope_facts: usize,
    /// `load_scope_cold`: loads with a fresh storage instance.
    pub load_cold: usize,
    /// `load_scope_warm`: loads through the cache.
    pub load_warm: usize,
    /// Generated corpus: facts.
    pub corpus_facts: usize,
    /// Generated corpus: scopes (users × two agent buckets).
    pub corpus_scopes: usize,
    /// `search`: queries.
    pub queries: usize,
    /// `get_context`: injection blocks built.
    pub get_context: usize,
    /// `count_long_fact`: long facts counted (each a new text).
    pub count_long_fact: usize,
    /// `apply_update`: update cycles.
    pub apply_update: usize,
    /// `migrate_v1`: legacy users.
    pub migrate_users: usize,
    /// `migrate_v1`: legacy facts per user.
    pub migrate_facts: usize,
    /// `gateway_get`: requests in total.
    pub gateway_requests: usize,
    /// `gateway_get`: concurrent keep-alive clients.
    pub gateway_clients: usize,
}

impl Sizes {
    /// The full sizes the targets are stated for.
    pub fn full() -> Self {
        Self {
            preset: "full",
            fsync_floor: 1_000,
            write_fact: 1_000,
            write_parallel: 1_000,
            writers: 8,
            scope_facts: 100,
            load_cold: 200,
            load_warm: 10_000,
            corpus_facts: 20_000,
            corpus_scopes: 200,
            queries: 2_000,
            get_context: 2_000,
            count_long_fact: 200,
            apply_update: 500,
            migrate_users: 500,
            migrate_facts: 20,
            gateway_requests: 20_000,
            gateway_clients: 16,
        }
    }

    /// About ten times smaller, for a quick look (same scope sizes, so per-operation figures
    /// stay comparable).
    pub fn quick() -> Self {
        Self {
            preset: "quick",
            fsync_floor: 100,
            write_fact: 100,
            write_parallel: 96,
            writers: 8,
            scope_facts: 100,
            load_cold: 20,
            load_warm: 1_000,
            corpus_facts: 2_000,
            corpus_scopes: 20,
            queries: 200,
            get_context: 200,
            count_long_fact: 20,
            apply_update: 50,
            migrate_users: 50,
            migrate_facts: 20,
            gateway_requests: 2_000,
            gateway_clients: 16,
        }
    }

    /// A few operations per workload: proves every workload runs end to end (CI smoke test).
    pub fn smoke() -> Self {
        Self {
            preset: "smoke",
            fsync_floor: 5,
            write_fact: 5,
            write_parallel: 8,
            writers: 4,
            scope_facts: 10,
            load_cold: 5,
            load_warm: 5,
            corpus_facts: 40,
            corpus_scopes: 4,
            queries: 5,
            get_context: 5,
            count_long_fact: 3,
            apply_update: 5,
            migrate_users: 5,
            migrate_facts: 3,
            gateway_requests: 8,
            gateway_clients: 2,
        }
    }

    /// The preset of a name.
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "full" => Some(Self::full()),
            "quick" => Some(Self::quick()),
            "smoke" => Some(Self::smoke()),
            _ => None,
        }
    }

    /// The sizes as JSON, for the report.
    pub fn to_json(&self) -> Value {
        json!({
            "preset": self.preset,
            "fsync_floor": self.fsync_floor,
            "write_fact": self.write_fact,
            "write_fact_parallel": self.write_parallel,
            "write_fact_one_user": self.write_parallel,
            "writers": self.writers,
            "scope_facts": self.scope_facts,
            "load_scope_cold": self.load_cold,
            "load_scope_warm": self.load_warm,
            "corpus_facts": self.corpus_facts,
            "corpus_scopes": self.corpus_scopes,
            "queries": self.queries,
            "get_context": self.get_context,
            "count_long_fact": self.count_long_fact,
            "apply_update": self.apply_update,
            "migrate_users": self.migrate_users,
            "migrate_facts_per_user": self.migrate_facts,
            "gateway_requests": self.gateway_requests,
            "gateway_clients": self.gateway_clients,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_named_and_quick_is_smaller() {
        for name in ["full", "quick", "smoke"] {
            assert_eq!(Sizes::by_name(name).map(|s| s.preset), Some(name));
        }
        assert!(Sizes::by_name("huge").is_none());
        let (f, q) = (Sizes::full(), Sizes::quick());
        assert!(q.write_fact * 5 <= f.write_fact);
        assert!(q.corpus_facts * 5 <= f.corpus_facts);
        assert_eq!(f.corpus_facts / f.corpus_scopes, 100);
    }
}
