//! `NoopManager`: the minimal backend. It accepts every turn, remembers nothing, searches to no
//! results and shows an empty document; everything else is unsupported.

use async_trait::async_trait;
use deermem_core::ports::{
    AddRequest, ContextRequest, ManagerCapabilities, MemoryManager, MemoryScope, SearchRequest,
};
use deermem_core::{ManagerError, MemoryMode, PublicFact, PublicMemoryDocument};

/// A backend that stores nothing (`manager_class: noop`).
#[derive(Debug, Clone, Copy)]
pub struct NoopManager {
    mode: MemoryMode,
}

impl NoopManager {
    /// A noop backend for a mode (it supports search, so tool mode is allowed).
    pub fn new(mode: MemoryMode) -> Self {
        Self { mode }
    }
}

#[async_trait]
impl MemoryManager for NoopManager {
    fn name(&self) -> &str {
        "NoopMemoryManager"
    }

    fn capabilities(&self) -> ManagerCapabilities {
        ManagerCapabilities {
            search: true,
            read_memory: true,
            clear_memory: true,
            import_memory: true,
            tool_mode: true,
            ..ManagerCapabilities::default()
        }
    }

    fn mode(&self) -> MemoryMode {
        self.mode
    }

    async fn add(&self, _request: AddRequest) -> Result<(), ManagerError> {
        Ok(())
    }

    async fn get_context(&self, _request: ContextRequest) -> Result<String, ManagerError> {
        Ok(String::new())
    }

    async fn search(&self, _request: SearchRequest) -> Result<Vec<PublicFact>, ManagerError> {
        Ok(Vec::new())
    }

    async fn get_memory(&self, _scope: MemoryScope) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(PublicMemoryDocument::empty())
    }

    async fn clear_memory(
        &self,
        _scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(PublicMemoryDocument::empty())
    }

    async fn import_memory(
        &self,
        _document: PublicMemoryDocument,
        _scope: MemoryScope,
    ) -> Result<PublicMemoryDocument, ManagerError> {
        Ok(PublicMemoryDocument::empty())
    }
}
