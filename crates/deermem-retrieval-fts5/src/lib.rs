//! DeerMem retrieval adapter: a derived SQLite FTS5/BM25 index with CJK n-gram search.
