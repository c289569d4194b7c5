//! DeerMem remote memory backend over Honcho's v3 HTTP API.
