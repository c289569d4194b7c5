//! The `FactMetadata` port: the usage heat and capacity-eviction audit sidecars of an agent,
//! read and written under the user's locks.

use async_trait::async_trait;
use deermem_core::policy::eviction::{EvictionDecision, FactUsageMap};
use deermem_core::ports::FactMetadata;
use deermem_core::{AgentName, FactId, StorageError, Timestamp, UserId};

use super::FileStorage;
use super::write::clear_metadata_locked;
use crate::paths::{AUDIT_FILE, USAGE_FILE};
use crate::sidecar;

#[async_trait]
impl FactMetadata for FileStorage {
    async fn get_fact_usage(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
    ) -> std::result::Result<FactUsageMap, StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        self.run(move |inner| {
            inner.locked(u.as_ref(), |udir, _| {
                Ok(sidecar::read_usage(&udir.metadata(&a).join(USAGE_FILE)))
            })
        })
        .await
    }

    async fn record_fact_accesses(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: &[FactId],
        at: Option<Timestamp>,
    ) -> std::result::Result<(), StorageError> {
        if ids.is_empty() {
            return Ok(());
        }
        let (u, a, ids) = (user.cloned(), agent.clone(), ids.to_vec());
        self.run(move |inner| {
            inner.locked(u.as_ref(), |udir, now| {
                // Only facts that exist, each once.
                let mut seen = std::collections::HashSet::new();
                let existing: Vec<String> = ids
                    .iter()
                    .filter(|id| seen.insert(id.as_str()))
                    .filter(|id| udir.fact(&a, id).is_file())
                    .map(|id| id.to_string())
                    .collect();
                if existing.is_empty() {
                    return Ok(());
                }
                sidecar::record_accesses(
                    &udir.metadata(&a).join(USAGE_FILE),
                    &existing,
                    at.unwrap_or(now),
                    inner.config.access_half_life_days,
                )
            })
        })
        .await
    }

    async fn record_capacity_eviction(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        decision: &EvictionDecision,
        max_facts: usize,
        shadow: Option<&EvictionDecision>,
        at: Option<Timestamp>,
    ) -> std::result::Result<(), StorageError> {
        if decision.evicted.is_empty() || self.inner.config.audit_max_entries == 0 {
            return Ok(());
        }
        let (u, a) = (user.cloned(), agent.clone());
        let (decision, shadow) = (decision.clone(), shadow.cloned());
        self.run(move |inner| {
            inner.locked(u.as_ref(), |udir, now| {
                sidecar::record_eviction(
                    &udir.metadata(&a).join(AUDIT_FILE),
                    &decision,
                    max_facts,
                    shadow.as_ref(),
                    at.unwrap_or(now),
                    inner.config.audit_max_entries,
                )
            })
        })
        .await
    }

    async fn clear_fact_metadata(
        &self,
        user: Option<&UserId>,
        agent: &AgentName,
        ids: Option<&[FactId]>,
    ) -> std::result::Result<(), StorageError> {
        let (u, a) = (user.cloned(), agent.clone());
        let ids: Option<Vec<String>> = ids.map(|i| i.iter().map(|x| x.to_string()).collect());
        self.run(move |inner| {
            inner.locked(u.as_ref(), |udir, _| {
                clear_metadata_locked(udir, &a, ids.as_deref())
            })
        })
        .await
    }
}
