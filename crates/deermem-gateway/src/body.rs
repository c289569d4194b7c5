//! The memory document's HTTP body: `serde_json` of the document's HTTP shape
//! ([`PublicMemoryDocument::for_http`]), written into a buffer sized once from the document.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use deermem_core::PublicMemoryDocument;

use crate::error::GatewayError;

/// A `200 application/json` response holding a memory document in its HTTP shape (the
/// manager-level fact fields dropped).
#[derive(Debug)]
pub(crate) struct JsonDocument(pub(crate) PublicMemoryDocument);

impl IntoResponse for JsonDocument {
    fn into_response(self) -> Response {
        let doc = self.0.for_http();
        let mut out = Vec::with_capacity(size_hint(&doc));
        if let Err(e) = serde_json::to_writer(&mut out, &doc) {
            return GatewayError::Internal(format!("cannot serialise the document: {e}"))
                .into_response();
        }
        ([(CONTENT_TYPE, "application/json")], out).into_response()
    }
}

/// An estimate of the body size, so the buffer is usually allocated once: the fact texts plus
/// a fixed allowance per fact for keys, time stamps, numbers and punctuation.
fn size_hint(doc: &PublicMemoryDocument) -> usize {
    const PER_FACT: usize = 448;
    const FIXED: usize = 2048;
    FIXED
        + doc
            .facts
            .iter()
            .map(|f| PER_FACT + f.content.len() + f.source.len())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_body_is_serde_json_of_the_http_shape() {
        let mut doc = PublicMemoryDocument::empty();
        doc.revision = Some(3);
        let bytes = axum::body::to_bytes(
            JsonDocument(doc.clone()).into_response().into_body(),
            1 << 20,
        )
        .await
        .unwrap();
        assert_eq!(bytes, serde_json::to_vec(&doc.for_http()).unwrap());
    }
}
