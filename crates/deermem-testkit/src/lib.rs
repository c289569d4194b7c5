//! Contract suites for every DeerMem port, plus fakes: in-memory storage, scripted LLM, manual clock.
