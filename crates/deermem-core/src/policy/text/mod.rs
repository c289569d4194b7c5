//! The full-text rule every search index shares, so that the FTS5 adapter and the PostgreSQL
//! adapter find the same facts for the same query: CJK runs as overlapping bigrams ([`cjk`]),
//! the terms a plain query searches for, OR'ed ([`terms`]), the words the FTS5 tokenizer makes
//! of text ([`tokens`], for indexes that tokenize themselves) and the ranking ([`rank`]: BM25,
//! decay on age, confidence).

pub mod cjk;
pub mod rank;
pub mod terms;
pub mod tokens;
