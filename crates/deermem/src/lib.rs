//! DeerMem facade: configuration loading and backend selection by manager_class.
