//! DeerMem remote memory backend over OpenViking's HTTP API.
