//! The `backend_config.postgres` keys under the adapter's names: the core's one settings type
//! (read by the configuration loader with its lax rules, checked by `validate`, built from a
//! URL alone by `from_url`; the URL never shown).

pub use deermem_core::config::{
    MAX_LEASE_SECONDS, MAX_POSTGRES_POOL_SIZE as MAX_POOL_SIZE, MIN_LEASE_SECONDS,
    PostgresCoherence as Coherence, PostgresSettings as PostgresConfig, PostgresTls as TlsConfig,
    PostgresTlsMode as TlsMode,
};
