//! DeerMem memory-update pipeline and the DeerMem manager: filtering, extraction, gates, queue, injection.
