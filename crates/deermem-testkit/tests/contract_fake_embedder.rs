//! The embedder contract suite run against the fake, and the fake's notion of meaning.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use deermem_core::EmbedError;
use deermem_core::policy::fusion::dot;
use deermem_core::ports::Embedder;
use deermem_testkit::embedder::{EmbedderFixture, FakeEmbedder};

async fn fixture() -> EmbedderFixture {
    let fake = FakeEmbedder::new(64);
    let breaker = fake.clone();
    EmbedderFixture {
        embedder: Arc::new(fake),
        break_next: Some(Box::new(move || {
            breaker.fail_next(EmbedError::Server {
                status: 503,
                message: "down".into(),
            });
        })),
        guard: Box::new(()),
    }
}

deermem_testkit::embedder_contract!(fixture());

#[test]
fn concepts_make_paraphrases_close() {
    deermem_testkit::block_on(async {
        let fake = FakeEmbedder::new(256).with_concepts(&[("tea", "drink"), ("drink", "drink")]);
        let v = fake
            .embed(&[
                "what does the user drink".to_owned(),
                "Prefers oolong tea".to_owned(),
                "Lives in Lisbon".to_owned(),
            ])
            .await
            .unwrap();
        assert!(dot(&v[0], &v[1]) > dot(&v[0], &v[2]));
        assert_eq!(fake.calls(), 1);
        assert_eq!(fake.texts_embedded(), 3);
    });
}
