//! DeerMem HTTP gateway: DeerFlow-compatible /api/memory routes plus extensions.
