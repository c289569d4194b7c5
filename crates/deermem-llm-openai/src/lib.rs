//! DeerMem LanguageModel adapter for OpenAI-compatible chat-completions servers.
