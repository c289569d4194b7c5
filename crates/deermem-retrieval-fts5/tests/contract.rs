//! The retrieval and vector-index contract suites run against the FTS5 adapter, in memory and
//! on disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// The contract on an in-memory index.
mod in_memory {
    deermem_testkit::retrieval_contract!(async {
        let clock = std::sync::Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-02T00:00:00Z",
        ));
        deermem_testkit::retrieval::RetrievalFixture::new(
            deermem_retrieval_fts5::Fts5Retrieval::in_memory(clock).expect("in-memory index"),
        )
    });
}

/// The contract on an index file in a temporary storage root.
mod on_disk {
    deermem_testkit::retrieval_contract!(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = std::sync::Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-02T00:00:00Z",
        ));
        let index =
            deermem_retrieval_fts5::Fts5Retrieval::open(dir.path(), clock).expect("index file");
        deermem_testkit::retrieval::RetrievalFixture::with_guard(index, dir)
    });
}

/// The vector-index contract on an in-memory index.
mod vectors_in_memory {
    deermem_testkit::vector_index_contract!(async {
        let clock = std::sync::Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-02T00:00:00Z",
        ));
        deermem_testkit::vector_index::VectorIndexFixture::new(
            deermem_retrieval_fts5::Fts5Retrieval::in_memory(clock).expect("in-memory index"),
        )
    });
}

/// The vector-index contract on an index file.
mod vectors_on_disk {
    deermem_testkit::vector_index_contract!(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = std::sync::Arc::new(deermem_testkit::clock::ManualClock::at(
            "2026-01-02T00:00:00Z",
        ));
        let index =
            deermem_retrieval_fts5::Fts5Retrieval::open(dir.path(), clock).expect("index file");
        deermem_testkit::vector_index::VectorIndexFixture::with_guard(index, dir)
    });
}
