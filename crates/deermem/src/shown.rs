//! What of a `backend_config` may be shown (the gateway's `/api/memory/config` and `/status`):
//! each backend's and storage adapter's allow-list of the keys it reads that hold no secret,
//! kept here beside the table of backends the facade builds (compiled in or not, so what is
//! shown does not depend on the build's features). Known secret keys show `"***"`; every other
//! key is left out, whatever its name; URLs lose their user-info, query and fragment.

use serde_json::{Map, Value};

/// How one allowed key is shown.
#[derive(Clone, Copy, Debug)]
enum Shown {
    /// A scalar, or a list of scalars, as is (anything larger shows `"***"`).
    Leaf,
    /// A URL without user-info, query string or fragment.
    Url,
    /// A known secret: `"***"` unless `null`.
    Secret,
    /// An object whose children follow their own rules (a scalar is shown as a leaf).
    Object(&'static [(&'static str, Shown)]),
    /// An object whose children follow their own rules; anything else in its place shows
    /// `"***"` (a section that may be mistaken for its secret, as `postgres` for its URL).
    Guarded(&'static [(&'static str, Shown)]),
    /// A mapping with free keys (user ids, workspace names) and scalar values; non-scalar
    /// values show `"***"`.
    Mapping,
}

use Shown::{Guarded, Leaf, Mapping, Object, Secret, Url};

/// DeerMem's `model` section.
const MODEL: &[(&str, Shown)] = &[
    ("provider", Leaf),
    ("model", Leaf),
    ("api_key", Secret),
    ("base_url", Url),
    ("temperature", Leaf),
    ("timeout_seconds", Leaf),
    ("connect_timeout_seconds", Leaf),
    ("max_retries", Leaf),
    ("max_tokens", Leaf),
];

/// OpenViking's `retrieval` section.
const RETRIEVAL: &[(&str, Shown)] = &[
    ("top_k", Leaf),
    ("score_threshold", Leaf),
    ("max_injection_chars", Leaf),
    ("content_mode", Leaf),
    ("injection_query", Leaf),
];

/// The `failure_policy` section of Honcho and OpenViking.
const FAILURE_POLICY: &[(&str, Shown)] = &[("read", Leaf), ("write", Leaf)];

/// DeerMem's `postgres` section: everything but the URL, which may hold a password and names
/// the database host (it is left out, not even `"***"`).
const POSTGRES: &[(&str, Shown)] = &[
    ("pool_size", Leaf),
    ("schema", Leaf),
    ("connect_timeout_seconds", Leaf),
    ("statement_timeout_seconds", Leaf),
    ("tls", Guarded(POSTGRES_TLS)),
    ("coherence", Leaf),
    ("lease_seconds", Leaf),
];

/// DeerMem's `postgres.tls` section.
const POSTGRES_TLS: &[(&str, Shown)] = &[("mode", Leaf), ("ca_file", Leaf)];

/// DeerMem's `queue` section (the turn journal and its retries).
const QUEUE: &[(&str, Shown)] = &[
    ("durable", Leaf),
    ("retry", Object(QUEUE_RETRY)),
    ("turn_lease", Leaf),
    ("claim_interval", Leaf),
];

/// DeerMem's `queue.retry` section.
const QUEUE_RETRY: &[(&str, Shown)] = &[
    ("max_attempts", Leaf),
    ("max_age", Leaf),
    ("initial_backoff_ms", Leaf),
    ("max_backoff", Leaf),
];

/// The embedded engine's keys (the fields of `DeerMemConfig`).
const DEERMEM: &[(&str, Shown)] = &[
    ("storage_path", Leaf),
    ("storage_class", Leaf),
    ("strict_user_scope", Leaf),
    ("manifest_filename", Leaf),
    ("file_lock_timeout_seconds", Leaf),
    ("retrieval_adapter", Leaf),
    ("debounce_seconds", Leaf),
    ("queue_max_depth", Leaf),
    ("queue_max_pending_bytes_per_user", Leaf),
    ("queue_max_pending_bytes", Leaf),
    ("max_facts", Leaf),
    ("fact_eviction_policy", Leaf),
    ("fact_eviction_shadow_enabled", Leaf),
    ("eviction_confidence_weight", Leaf),
    ("eviction_confirmation_weight", Leaf),
    ("eviction_access_weight", Leaf),
    ("eviction_confirmation_half_life_days", Leaf),
    ("eviction_access_half_life_days", Leaf),
    ("eviction_correction_reserved_fraction", Leaf),
    ("eviction_correction_reserved_max", Leaf),
    ("eviction_audit_max_entries", Leaf),
    ("fact_confidence_threshold", Leaf),
    ("max_injection_tokens", Leaf),
    ("token_counting", Leaf),
    ("guaranteed_categories", Leaf),
    ("guaranteed_token_budget", Leaf),
    ("staleness_review_enabled", Leaf),
    ("staleness_age_days", Leaf),
    ("staleness_min_candidates", Leaf),
    ("staleness_max_removals_per_cycle", Leaf),
    ("staleness_protected_categories", Leaf),
    ("staleness_max_lifetime_multiplier", Leaf),
    ("staleness_max_extension_days", Leaf),
    ("consolidation_enabled", Leaf),
    ("consolidation_min_facts", Leaf),
    ("consolidation_max_groups_per_cycle", Leaf),
    ("consolidation_max_sources", Leaf),
    ("watermark_max_keys", Leaf),
    ("cache_max_scopes", Leaf),
    ("patterns_dir", Leaf),
    ("prompts_dir", Leaf),
    ("model", Object(MODEL)),
    ("queue", Object(QUEUE)),
];

/// The storage adapters' own sections in DeerMem's `backend_config`.
const STORAGE_SECTIONS: &[(&str, Shown)] = &[("postgres", Guarded(POSTGRES))];

/// Honcho's keys.
const HONCHO: &[(&str, Shown)] = &[
    ("base_url", Url),
    ("api_key", Secret),
    ("allow_insecure_http", Leaf),
    ("workspace_prefix", Leaf),
    ("workspace_overrides", Mapping),
    ("user_peer_overrides", Mapping),
    ("assistant_peer", Leaf),
    ("timeout_seconds", Leaf),
    ("connect_timeout_seconds", Leaf),
    ("message_char_limit", Leaf),
    ("max_injection_chars", Leaf),
    ("failure_policy", Object(FAILURE_POLICY)),
];

/// OpenViking's keys.
const OPENVIKING: &[(&str, Shown)] = &[
    ("base_url", Url),
    ("api_key", Secret),
    ("allow_insecure_http", Leaf),
    ("timeout_seconds", Leaf),
    ("max_injection_chars", Leaf),
    ("failure_policy", Object(FAILURE_POLICY)),
    ("owner_user_id", Leaf),
    // The name of the variable holding the key, not the key.
    ("api_key_env", Leaf),
    ("default_peer_id", Leaf),
    ("startup_policy", Leaf),
    ("max_seen_message_ids", Leaf),
    ("retrieval", Object(RETRIEVAL)),
];

/// Every shipped backend's and storage adapter's keys: a key is shown by the rule of the first
/// list that names it (the backends that share a key show it alike).
const ALL: [&[(&str, Shown)]; 4] = [DEERMEM, STORAGE_SECTIONS, HONCHO, OPENVIKING];

const HIDDEN: &str = "***";

/// The part of a `backend_config` that may be shown: keys on the allow-list of the shipped
/// backends only (anything else, such as `api-key`, `bearer` or `my_llm_credential`, is left
/// out), known secrets as `"***"`, and every `base_url` without user-info, query string or
/// fragment (`http://svc:PASSWORD@host/v1?key=K` shows `http://host/v1`).
pub fn shown_backend_config(backend_config: &Map<String, Value>) -> Value {
    Value::Object(shown_object(backend_config, &ALL))
}

fn shown_object(m: &Map<String, Value>, rules: &[&[(&str, Shown)]]) -> Map<String, Value> {
    m.iter()
        .filter_map(|(k, v)| {
            let (_, rule) = rules
                .iter()
                .flat_map(|r| r.iter())
                .find(|(name, _)| name == k)?;
            Some((k.clone(), shown_value(v, *rule)))
        })
        .collect()
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

fn shown_value(v: &Value, rule: Shown) -> Value {
    match (rule, v) {
        (_, Value::Null) => Value::Null,
        (Secret, _) => Value::String(HIDDEN.into()),
        (Url, Value::String(s)) => Value::String(url_without_credentials(s)),
        (Object(children) | Guarded(children), Value::Object(m)) => {
            Value::Object(shown_object(m, &[children]))
        }
        (Mapping, Value::Object(m)) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), shown_value(x, Leaf)))
                .collect(),
        ),
        (Leaf | Object(_) | Mapping, x) if is_scalar(x) => x.clone(),
        (Leaf, Value::Array(items)) if items.iter().all(is_scalar) => v.clone(),
        _ => Value::String(HIDDEN.into()),
    }
}

/// A URL without what may hold a credential: the user-info before `@` in the authority, the
/// query string and the fragment. Text that is not a URL loses the same parts.
pub fn url_without_credentials(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or("");
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    match scheme {
        Some(scheme) => format!("{scheme}://{host}{path}"),
        None => format!("{host}{path}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shown(v: Value) -> Value {
        shown_backend_config(v.as_object().unwrap())
    }

    #[test]
    fn the_postgres_url_is_never_shown() {
        let out = shown(json!({
            "storage_class": "postgres",
            "postgres": {
                "url": "postgres://deermem:hunter2@db.internal:5432/memory",
                "pool_size": 4,
                "schema": "mem",
                "tls": {"mode": "verify-full", "ca_file": "/etc/ca.pem"},
            },
        }));
        assert_eq!(
            out,
            json!({
                "storage_class": "postgres",
                "postgres": {
                    "pool_size": 4,
                    "schema": "mem",
                    "tls": {"mode": "verify-full", "ca_file": "/etc/ca.pem"},
                },
            })
        );
        // A URL in the wrong place (a string instead of the block) is hidden too.
        let out = shown(json!({"postgres": "postgres://u:hunter2@h/db"}));
        assert!(!out.to_string().contains("hunter2"), "{out}");
    }

    #[test]
    fn only_allowed_keys_are_shown_and_secrets_are_hidden() {
        let out = shown(json!({
            "max_facts": 50,
            "guaranteed_categories": ["correction"],
            "api_key": "sk-top",
            "apiKey": "sk-camel",
            "api-key": "sk-dash",
            "access_key_id": "AKIA",
            "bearer": "b-token",
            "my_llm_credential": "cred",
            "model": {
                "model": "m",
                "api_key": "sk-model",
                "base_url": "http://svcuser:PASSWORD@llm.internal:8080/v1?api-key=QKEY#frag",
                "bearer": "nested",
            },
            "retrieval": {"top_k": 5, "token": "t"},
            "failure_policy": {"read": "fail_open", "secret": "s"},
            "user_peer_overrides": {"alice@example.com": "peer-a", "bob": {"password": "p"}},
            "storage_path": {"password": "p"},
            "api_key_env": "OV_KEY",
            "timeout_seconds": null,
        }));
        assert_eq!(
            out,
            json!({
                "max_facts": 50,
                "guaranteed_categories": ["correction"],
                "api_key": "***",
                "model": {"model": "m", "api_key": "***", "base_url": "http://llm.internal:8080/v1"},
                "retrieval": {"top_k": 5},
                "failure_policy": {"read": "fail_open"},
                "user_peer_overrides": {"alice@example.com": "peer-a", "bob": "***"},
                "storage_path": "***",
                "api_key_env": "OV_KEY",
                "timeout_seconds": null,
            })
        );
        let text = out.to_string();
        for secret in [
            "sk-", "AKIA", "b-token", "cred", "PASSWORD", "svcuser", "QKEY", "nested",
        ] {
            assert!(!text.contains(secret), "{secret} shown in {text}");
        }
    }

    #[test]
    fn urls_lose_user_info_query_and_fragment() {
        for (given, want) in [
            ("http://svcuser:PASSWORD@host/v1", "http://host/v1"),
            ("https://u@host:8443", "https://host:8443"),
            ("https://host/v1?key=abc", "https://host/v1"),
            ("https://host/v1#key=abc", "https://host/v1"),
            ("http://a:b@c@host/p", "http://host/p"),
            ("user:pw@host/v1", "host/v1"),
            ("https://api.openai.com/v1", "https://api.openai.com/v1"),
            ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
            ("", ""),
        ] {
            assert_eq!(url_without_credentials(given), want, "{given}");
        }
        // The Honcho / OpenViking top-level `base_url` too.
        assert_eq!(
            shown(json!({"base_url": "http://k:SECRET@ov:1933?token=T"})),
            json!({"base_url": "http://ov:1933"})
        );
    }
}
