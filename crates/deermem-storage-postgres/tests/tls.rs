//! TLS to PostgreSQL against a throwaway cluster started with `ssl=on` and a certificate made
//! here (a test CA signing a server certificate for `localhost`): `require` encrypts without
//! checking, `verify-full` checks the chain against `ca_file` and the host name, and a wrong CA,
//! a wrong name or a server without TLS are refused with typed errors that say why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use deermem_storage_postgres::{PgDatabase, PgError, PostgresConfig, TlsMode};
use deermem_testkit::pgcluster::{PgCluster, ServerTls};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA (its PEM) and a server certificate it signed for `names`.
struct Pki {
    ca_pem: String,
    server: ServerTls,
}

fn pki(ca_name: &str, names: &[&str]) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "deermem test server");
    let cert = params.signed_by(&key, &ca).unwrap();
    Pki {
        ca_pem: ca.pem(),
        server: ServerTls {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn config(url: &str, mode: TlsMode, ca_file: Option<&Path>) -> PostgresConfig {
    let mut c = PostgresConfig::new(url);
    c.pool_size = 1;
    c.connect_timeout_seconds = 20.0;
    c.tls.mode = mode;
    c.tls.ca_file = ca_file.map(|p| p.display().to_string());
    c
}

/// Whether this session's connection is encrypted, as the server sees it.
async fn encrypted(store: &PgDatabase) -> bool {
    let client = store.client().await.unwrap();
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

fn expect_tls_error(result: Result<PgDatabase, PgError>, wanted: &str) -> String {
    match result {
        Err(PgError::Tls { message }) => {
            assert!(
                message.contains(wanted),
                "expected {wanted:?} in the error, got {message:?}"
            );
            message
        }
        Err(other) => panic!("expected a TLS error naming {wanted:?}, got {other:?}: {other}"),
        Ok(store) => panic!("connected although TLS should have failed: {store:?}"),
    }
}

/// One cluster for every TLS scenario (starting one takes seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_against_a_server_with_ssl_on() {
    let good = pki("deermem test CA", &["localhost"]);
    let other = pki("some other CA", &["localhost"]);
    let cluster = PgCluster::start_fresh_tls(&good.server).unwrap_or_else(|e| panic!("{e}"));
    let files = tempfile::tempdir().unwrap();
    let ca = write(files.path(), "ca.pem", &good.ca_pem);
    let wrong_ca = write(files.path(), "other-ca.pem", &other.ca_pem);
    // The cluster's URL names 127.0.0.1; the certificate names `localhost`.
    let by_ip = cluster.url().to_owned();
    let by_name = by_ip.replace("@127.0.0.1:", "@localhost:");
    assert_ne!(by_ip, by_name);

    // disable: a plain connection (the server still accepts those).
    let plain = PgDatabase::connect(&config(&by_ip, TlsMode::Disable, None))
        .await
        .unwrap();
    assert!(!encrypted(&plain).await, "disable must not encrypt");

    // require: encrypted, the certificate not checked (neither issuer nor name).
    let store = PgDatabase::connect(&config(&by_ip, TlsMode::Require, None))
        .await
        .unwrap();
    assert!(encrypted(&store).await, "require must encrypt");

    // verify-full with the right CA and the certificate's name.
    let store = PgDatabase::connect(&config(&by_name, TlsMode::VerifyFull, Some(&ca)))
        .await
        .unwrap();
    assert!(encrypted(&store).await, "verify-full must encrypt");
    store.migrate().await.unwrap();

    // verify-full with a CA that did not sign the server's certificate.
    let message = expect_tls_error(
        PgDatabase::connect(&config(&by_name, TlsMode::VerifyFull, Some(&wrong_ca))).await,
        "UnknownIssuer",
    );
    assert!(message.contains("certificate"), "{message}");

    // verify-full with the right CA but a host the certificate does not name.
    expect_tls_error(
        PgDatabase::connect(&config(&by_ip, TlsMode::VerifyFull, Some(&ca))).await,
        "not valid for name",
    );

    // verify-full without a CA file trusts only the bundled public roots: a private CA fails.
    expect_tls_error(
        PgDatabase::connect(&config(&by_name, TlsMode::VerifyFull, None)).await,
        "UnknownIssuer",
    );

    // A CA file that is not PEM is a configuration error naming the key.
    let junk = write(files.path(), "junk.pem", "not a certificate\n");
    match PgDatabase::connect(&config(&by_name, TlsMode::VerifyFull, Some(&junk))).await {
        Err(PgError::Config { key, .. }) => assert_eq!(key, "postgres.tls.ca_file"),
        other => panic!("{other:?}"),
    }
    let missing = files.path().join("missing.pem");
    match PgDatabase::connect(&config(&by_name, TlsMode::VerifyFull, Some(&missing))).await {
        Err(PgError::Config { key, message }) => {
            assert_eq!(key, "postgres.tls.ca_file");
            assert!(message.contains("missing.pem"), "{message}");
        }
        other => panic!("{other:?}"),
    }

    // The URL's libpq parameters choose the same modes (`deermem migrate --to <URL>`).
    let url = format!("{by_name}?sslmode=verify-full&sslrootcert={}", ca.display());
    let store = PgDatabase::connect(&PostgresConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    assert!(encrypted(&store).await);
    let store = PgDatabase::connect(
        &PostgresConfig::from_url(&format!("{by_ip}?sslmode=require")).unwrap(),
    )
    .await
    .unwrap();
    assert!(encrypted(&store).await);
    // A URL asking for TLS while the mode says disable is refused, not downgraded.
    let mut c = config(&format!("{by_ip}?sslmode=require"), TlsMode::Disable, None);
    c.url = format!("{by_ip}?sslmode=require").into();
    match PgDatabase::connect(&c).await {
        Err(PgError::Config { key, .. }) => assert_eq!(key, "postgres.tls.mode"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_is_refused() {
    let cluster = PgCluster::start_fresh().unwrap_or_else(|e| panic!("{e}"));
    let err = PgDatabase::connect(&config(cluster.url(), TlsMode::Require, None))
        .await
        .unwrap_err();
    match &err {
        PgError::Tls { message } => assert!(message.contains("TLS"), "{message}"),
        other => panic!("{other:?}"),
    }
    // The plain connection works, so the refusal was about TLS alone.
    PgDatabase::connect(&config(cluster.url(), TlsMode::Disable, None))
        .await
        .unwrap();
}
