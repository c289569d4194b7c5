//! The retrieval contract suite run against the in-memory substring fake.

deermem_testkit::retrieval_contract!(async {
    deermem_testkit::retrieval::RetrievalFixture::new(
        deermem_testkit::retrieval::SubstringRetrieval::new(),
    )
});
