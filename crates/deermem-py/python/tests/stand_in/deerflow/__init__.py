"""A stand-in of the DeerFlow host for the deermem_rs tests (written from the memory-manager
contract; no DeerFlow code)."""
