//! The retrieval contract suite run against the in-memory substring fake.

#![allow(clippy::unwrap_used, clippy::expect_used)]

deermem_testkit::retrieval_contract!(async {
    deermem_testkit::retrieval::RetrievalFixture::new(
        deermem_testkit::retrieval::SubstringRetrieval::new(),
    )
});
