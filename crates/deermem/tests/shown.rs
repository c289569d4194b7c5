//! `shown_backend_config` for every `manager_class`: the backend's own settings type parsed and
//! serialised, so every key it reads shows with its value or default, a secret (`api_key`, the
//! PostgreSQL URL) as `"***"`, a URL without credentials, and no other key; a configuration that
//! does not parse, or an unknown backend, shows a fixed reason and nothing of itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use deermem::shown_backend_config;
use serde_json::{Value, json};

/// Every secret below carries this mark; no shown text may contain it.
const MARK: &str = "DISTINCT-e61b";

fn shown(class: &str, v: Value) -> Value {
    let out = shown_backend_config(class, v.as_object().unwrap());
    let text = out.to_string();
    for secret in [MARK, "svcuser", "PASSWORD"] {
        assert!(!text.contains(secret), "{class}: {secret} in {text}");
    }
    out
}

/// Keys no backend reads, each holding a secret.
fn hostile_keys() -> Value {
    json!({
        "apiKey": format!("camel-{MARK}"), "api-key": format!("dash-{MARK}"),
        "access_key_id": format!("AKIA-{MARK}"), "bearer": format!("b-{MARK}"),
        "my_llm_credential": format!("cred-{MARK}"),
    })
}

fn with_hostile_keys(mut v: Value) -> Value {
    let Value::Object(extra) = hostile_keys() else {
        unreachable!()
    };
    v.as_object_mut().unwrap().extend(extra);
    v
}

fn assert_no_hostile_key(out: &Value) {
    for key in hostile_keys().as_object().unwrap().keys() {
        assert!(out.get(key).is_none(), "{key} shown in {out}");
    }
}

#[cfg(all(feature = "engine", feature = "storage-file"))]
#[test]
fn deermem_with_file_storage_shows_its_settings_and_hides_the_model_key() {
    let out = shown(
        "deermem",
        with_hostile_keys(json!({
            "storage_path": "/data/mem",
            "max_facts": 50,
            "guaranteed_categories": ["correction"],
            "model": {
                "model": "gpt-x",
                "api_key": format!("sk-{MARK}"),
                "base_url": format!("http://svcuser:PASSWORD@llm.internal:8080/v1?api-key=Q{MARK}#frag"),
                "bearer": format!("nested-{MARK}"),
            },
            "embedding": {"provider": "openai", "api_key": format!("ek-{MARK}")},
        })),
    );
    assert_no_hostile_key(&out);
    assert_eq!(out["storage_path"], "/data/mem");
    assert_eq!(out["max_facts"], 50);
    assert_eq!(out["guaranteed_categories"], json!(["correction"]));
    assert_eq!(out["model"]["model"], "gpt-x");
    assert_eq!(out["model"]["api_key"], "***");
    assert_eq!(out["model"]["base_url"], "http://llm.internal:8080/v1");
    assert!(out["model"].get("bearer").is_none());
    assert_eq!(out["embedding"]["api_key"], "***");
    // Defaults are shown too, and the storage's selected index.
    assert_eq!(out["debounce_seconds"], 30);
    assert_eq!(out["retrieval_adapter"], "fts5");
    assert_eq!(out["queue"]["retry"]["max_attempts"], 10);
    assert_eq!(out["model"]["timeout_seconds"], 60.0);
    assert!(out.get("postgres").is_none());
}

#[cfg(feature = "storage-postgres")]
#[test]
fn deermem_with_a_postgres_section_shows_it_by_its_adapter_without_the_url() {
    for url in [
        format!("postgres://deermem:{MARK}@db-{MARK}.internal:5432/memory"),
        format!("host=db-{MARK} user=u password={MARK}"),
        "$DATABASE_URL".to_owned(),
    ] {
        let out = shown(
            "deermem",
            json!({
                "storage_class": "postgres",
                "postgres": {
                    "url": url, "pool_size": "4", "schema": "mem",
                    "tls": {"mode": "verify-full", "ca_file": "/etc/ca.pem"},
                },
            }),
        );
        assert_eq!(out["storage_class"], "postgres");
        assert_eq!(out["retrieval_adapter"], "postgres");
        let pg = &out["postgres"];
        assert_eq!(pg["url"], "***");
        assert_eq!(pg["pool_size"], 4);
        assert_eq!(pg["schema"], "mem");
        assert_eq!(
            pg["tls"],
            json!({"mode": "verify-full", "ca_file": "/etc/ca.pem"})
        );
        assert_eq!(pg["coherence"], "lease");
    }
    // A section next to the file storage is checked and shown alike.
    let out = shown(
        "deermem",
        json!({"postgres": {"url": format!("postgres://u:{MARK}@h/db"), "pool_size": 2}}),
    );
    assert_eq!(out["postgres"]["url"], "***");
    // A URL in the wrong place (a string instead of the block) does not parse: nothing shown.
    let out = shown(
        "deermem",
        json!({"postgres": format!("postgres://u:{MARK}@h/db")}),
    );
    assert_eq!(
        out.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["not_shown"]
    );
}

#[cfg(feature = "honcho")]
#[test]
fn honcho_shows_its_settings_with_the_key_hidden() {
    let out = shown(
        "honcho",
        with_hostile_keys(json!({
            "base_url": "https://honcho.internal/pfx/",
            "api_key": format!("hk-{MARK}"),
            "user_peer_overrides": {"alice@example.com": "alice"},
            "failure_policy": {"read": "fail_closed"},
        })),
    );
    assert_no_hostile_key(&out);
    assert_eq!(out["base_url"], "https://honcho.internal/pfx");
    assert_eq!(out["api_key"], "***");
    assert_eq!(
        out["user_peer_overrides"],
        json!({"alice@example.com": "alice"})
    );
    assert_eq!(out["failure_policy"], json!({"read": "fail_closed"}));
    assert_eq!(out["assistant_peer"], "deerflow");
    // Without a key, `null`.
    assert_eq!(shown("honcho", json!({}))["api_key"], Value::Null);
    // Honcho refuses a base URL with credentials, a query or a fragment: only why is shown.
    let out = shown(
        "honcho",
        json!({"base_url": format!("https://svcuser:PASSWORD@honcho.internal/?token=Q{MARK}"),
               "api_key": format!("hk-{MARK}")}),
    );
    assert!(out.get("not_shown").is_some(), "{out}");
}

#[cfg(feature = "openviking")]
#[test]
fn openviking_shows_its_settings_and_never_reads_the_key() {
    // OpenViking refuses unknown keys, so the hostile ones make the whole config unshown.
    let out = shown(
        "openviking",
        with_hostile_keys(json!({"owner_user_id": "alice"})),
    );
    assert!(out.get("not_shown").is_some(), "{out}");
    let out = shown(
        "openviking",
        json!({
            "owner_user_id": "alice",
            "base_url": "http://openviking:1933/",
            "api_key_env": "TEAM_OV_KEY",
            "retrieval": {"top_k": 5},
        }),
    );
    assert_eq!(out["base_url"], "http://openviking:1933");
    assert_eq!(
        out["api_key_env"], "TEAM_OV_KEY",
        "the variable's name, not the key"
    );
    assert!(out.get("api_key").is_none());
    assert_eq!(out["retrieval"]["top_k"], 5);
    assert_eq!(
        out["failure_policy"],
        json!({"read": "fail_open", "write": "log_and_drop"})
    );
    // A base URL with credentials is refused: only why is shown.
    let out = shown(
        "openviking",
        json!({"owner_user_id": "alice",
               "base_url": format!("http://svcuser:PASSWORD@openviking:1933?token=Q{MARK}")}),
    );
    assert!(out.get("not_shown").is_some(), "{out}");
}

#[test]
fn noop_shows_nothing() {
    assert_eq!(shown("noop", with_hostile_keys(json!({}))), json!({}));
}

#[test]
fn an_unknown_backend_or_an_invalid_config_shows_only_why() {
    let out = shown(
        "pkg.module:Manager",
        with_hostile_keys(json!({"api_key": format!("sk-{MARK}")})),
    );
    assert_eq!(
        out,
        json!({"not_shown": "memory.manager_class names no known backend"})
    );
    #[cfg(all(feature = "engine", feature = "storage-file"))]
    {
        // A value out of range, next to a secret: neither the value nor the secret is quoted.
        let out = shown(
            "deermem",
            json!({"max_facts": format!("many-{MARK}"), "model": {"api_key": format!("sk-{MARK}")}}),
        );
        assert_eq!(
            out,
            json!({"not_shown": "it does not parse; starting the backend names the key"})
        );
    }
}
