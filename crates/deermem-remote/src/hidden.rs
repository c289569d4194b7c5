//! [`is_clarification_response`]: DeerFlow's rule for the hidden (`hide_from_ui`) messages a
//! remote backend still captures, the core's rule the updater's filter also applies.

pub use deermem_core::message::is_human_input_response as is_clarification_response;
