//! DeerMem file storage: Markdown facts and JSON summaries, byte-compatible with the Python reference.
