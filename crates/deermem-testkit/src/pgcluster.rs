//! A throwaway PostgreSQL cluster for tests and benchmarks: `initdb` into a temporary directory,
//! `pg_ctl start` on a free loopback port, removed again on drop; or the server named by
//! `DEERMEM_TEST_POSTGRES_URL` when that is set.
//!
//! The server binaries are looked up in `$DEERMEM_PG_BIN`, then `/usr/lib/postgresql/<version>/bin`
//! (the newest), then `pg_config --bindir`. When none is found [`PgCluster::start`] fails naming
//! the package to install; it never skips. PostgreSQL refuses to run as root, so as root the
//! cluster belongs to the `postgres` user (else `nobody`) and its commands run through `runuser`.
//! [`PgCluster::start_fresh_tls`] starts one with `ssl=on` and a certificate the test made.
//! A cluster started here can be stopped and started again on the same port
//! ([`PgCluster::stop`], [`PgCluster::start_again`]) for outage tests, and made to require a
//! password of one role ([`PgCluster::require_password`]).

use std::fmt;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where the test suites find an existing server instead of starting one.
pub const URL_ENV: &str = "DEERMEM_TEST_POSTGRES_URL";
/// A directory holding `initdb`, `pg_ctl` and `postgres`, tried first.
pub const BIN_ENV: &str = "DEERMEM_PG_BIN";

/// Why a cluster could not be provided.
#[derive(Debug)]
pub enum PgClusterError {
    /// No server binaries on this machine.
    NoBinaries {
        /// The places looked at.
        searched: Vec<PathBuf>,
    },
    /// A command failed; its output is kept for the report.
    Command {
        /// What was run.
        what: String,
        /// Its standard error (and output), trimmed.
        output: String,
    },
    /// The file system refused (temporary directory, ownership).
    Io(std::io::Error),
}

impl fmt::Display for PgClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoBinaries { searched } => write!(
                f,
                "no PostgreSQL server binaries (initdb, pg_ctl) found in {searched:?}: install them \
                 with `apt-get install postgresql`, point {BIN_ENV} at their directory, or set \
                 {URL_ENV} to a server the tests may use"
            ),
            Self::Command { what, output } => write!(f, "{what} failed: {output}"),
            Self::Io(e) => write!(f, "cannot prepare the PostgreSQL cluster directory: {e}"),
        }
    }
}

impl std::error::Error for PgClusterError {}

impl From<std::io::Error> for PgClusterError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// The server side of TLS for [`PgCluster::start_fresh_tls`]: PEM texts of the certificate
/// (chain) and its private key.
#[derive(Clone)]
pub struct ServerTls {
    /// The server certificate, optionally followed by intermediates.
    pub cert_pem: String,
    /// The certificate's private key (PKCS#8 or PKCS#1).
    pub key_pem: String,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

/// A running PostgreSQL server for one test process. Dropping it stops a cluster it started.
pub struct PgCluster {
    url: String,
    owned: Option<Owned>,
}

/// What a started cluster needs to be stopped and removed.
struct Owned {
    dir: tempfile::TempDir,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    /// The server options it was started with (`pg_ctl -o`).
    options: String,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("port", &self.owned.as_ref().map(|o| o.port))
            .field("started_here", &self.owned.is_some())
            .finish_non_exhaustive()
    }
}

impl PgCluster {
    /// The server named by [`URL_ENV`], or a fresh cluster started now.
    ///
    /// # Errors
    /// No binaries, or `initdb` / `pg_ctl` failed (their output is in the error).
    pub fn start() -> Result<Self, PgClusterError> {
        if let Ok(url) = std::env::var(URL_ENV)
            && !url.trim().is_empty()
        {
            return Ok(Self { url, owned: None });
        }
        Self::start_fresh()
    }

    /// A fresh cluster, whatever the environment says.
    ///
    /// # Errors
    /// As [`PgCluster::start`].
    pub fn start_fresh() -> Result<Self, PgClusterError> {
        Self::start_with(None, false)
    }

    /// A fresh cluster that also offers TLS (`ssl=on`) with `tls`'s server certificate and
    /// key; plain connections are still accepted, so a test can compare both.
    ///
    /// # Errors
    /// As [`PgCluster::start`], and when the key files cannot be written.
    pub fn start_fresh_tls(tls: &ServerTls) -> Result<Self, PgClusterError> {
        Self::start_with(Some(tls), false)
    }

    /// A fresh cluster that syncs its writes (`fsync`, full-page writes and
    /// `synchronous_commit` at their defaults, all on), for benchmarks: a commit is
    /// acknowledged once it is on disk. Test clusters turn `fsync` off.
    ///
    /// # Errors
    /// As [`PgCluster::start`].
    pub fn start_durable() -> Result<Self, PgClusterError> {
        Self::start_with(None, true)
    }

    fn start_with(tls: Option<&ServerTls>, durable: bool) -> Result<Self, PgClusterError> {
        let bin = find_binaries()?;
        let run_as = if is_root() {
            Some(unprivileged_user())
        } else {
            None
        };
        let dir = tempfile::Builder::new().prefix("deermem-pg-").tempdir()?;
        if let Some(user) = &run_as {
            chown_to(dir.path(), user)?;
        }
        let data = dir.path().join("data");
        let initdb = bin.join("initdb");
        let out = run(
            run_as.as_deref(),
            &initdb,
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "deermem".as_ref(),
                "--auth=trust".as_ref(),
                "--encoding=UTF8".as_ref(),
                "--locale=C".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        check("initdb", &out)?;
        let ssl_options = match tls {
            None => String::new(),
            Some(t) => {
                let cert = dir.path().join("server.crt");
                let key = dir.path().join("server.key");
                std::fs::write(&cert, &t.cert_pem)?;
                std::fs::write(&key, &t.key_pem)?;
                // The server refuses a key others may read.
                std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
                if let Some(user) = &run_as {
                    chown_to(&cert, user)?;
                    chown_to(&key, user)?;
                }
                format!(
                    " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                    cert.display(),
                    key.display()
                )
            }
        };
        // A port can be taken between our probe and the server's bind: try a few.
        let mut last = None;
        for _ in 0..5 {
            let port = free_port()?;
            let sync = if durable {
                ""
            } else {
                " -c fsync=off -c full_page_writes=off"
            };
            let options = format!(
                "-c listen_addresses=127.0.0.1 -c port={port} -k {}{sync} \
                 -c max_connections=200{ssl_options}",
                dir.path().display()
            );
            let log = dir.path().join("server.log");
            let out = run(
                run_as.as_deref(),
                &bin.join("pg_ctl"),
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-o".as_ref(),
                    options.as_ref(),
                    "-l".as_ref(),
                    log.as_os_str(),
                    "-w".as_ref(),
                    "-t".as_ref(),
                    "60".as_ref(),
                    "start".as_ref(),
                ],
            )?;
            if out.status.success() {
                return Ok(Self {
                    url: format!("postgres://deermem@127.0.0.1:{port}/postgres"),
                    owned: Some(Owned {
                        dir,
                        bin,
                        run_as,
                        port,
                        options,
                    }),
                });
            }
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            last = Some(PgClusterError::Command {
                what: "pg_ctl start".into(),
                output: format!("{}\n{}", output_text(&out), tail(&log_text, 2000)),
            });
        }
        Err(last.unwrap_or_else(|| PgClusterError::Command {
            what: "pg_ctl start".into(),
            output: "no attempt made".into(),
        }))
    }

    /// The connection URL of the server's `postgres` database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of database `name` on the same server (the database is not created).
    pub fn database_url(&self, name: &str) -> String {
        match self.url.rsplit_once('/') {
            Some((server, last)) if !last.contains('@') && !last.contains(':') => {
                let query = last.split_once('?').map(|(_, q)| q);
                match query {
                    Some(q) => format!("{server}/{name}?{q}"),
                    None => format!("{server}/{name}"),
                }
            }
            _ => format!("{}/{name}", self.url.trim_end_matches('/')),
        }
    }

    /// Whether this process started the server (and stops it on drop).
    pub fn started_here(&self) -> bool {
        self.owned.is_some()
    }

    fn owned(&self, what: &str) -> Result<&Owned, PgClusterError> {
        self.owned.as_ref().ok_or_else(|| PgClusterError::Command {
            what: what.into(),
            output: format!("the server was not started by this process ({URL_ENV} is set)"),
        })
    }

    /// Stops the server (`pg_ctl stop -m fast`: sessions are ended, nothing is lost), to see
    /// how clients behave while the database is down.
    ///
    /// # Errors
    /// A server not started here, or `pg_ctl` failed.
    pub fn stop(&self) -> Result<(), PgClusterError> {
        let o = self.owned("pg_ctl stop")?;
        let data = o.dir.path().join("data");
        let out = run(
            o.run_as.as_deref(),
            &o.bin.join("pg_ctl"),
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "fast".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        )?;
        check("pg_ctl stop", &out)
    }

    /// Starts a server stopped with [`PgCluster::stop`] again, on the same port with the same
    /// options, and waits until it accepts connections.
    ///
    /// # Errors
    /// A server not started here, or `pg_ctl` failed.
    pub fn start_again(&self) -> Result<(), PgClusterError> {
        let o = self.owned("pg_ctl start")?;
        let data = o.dir.path().join("data");
        let log = o.dir.path().join("server.log");
        let out = run(
            o.run_as.as_deref(),
            &o.bin.join("pg_ctl"),
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-o".as_ref(),
                o.options.as_ref(),
                "-l".as_ref(),
                log.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "start".as_ref(),
            ],
        )?;
        check("pg_ctl start", &out)
    }

    /// Creates `role` (a login role with `password`, allowed to create in database
    /// `postgres`) and makes the server require that password from it over TCP
    /// (`scram-sha-256`); other roles keep trust authentication.
    ///
    /// # Errors
    /// A server not started here, or `psql` / `pg_ctl reload` failed.
    pub fn require_password(&self, role: &str, password: &str) -> Result<(), PgClusterError> {
        let o = self.owned("require a password")?;
        let sql = format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD '{}'; GRANT CREATE ON DATABASE postgres TO \"{role}\"",
            password.replace('\'', "''")
        );
        let socket_dir = o.dir.path().as_os_str().to_owned();
        let port = o.port.to_string();
        let out = run(
            o.run_as.as_deref(),
            &o.bin.join("psql"),
            &[
                "-h".as_ref(),
                socket_dir.as_os_str(),
                "-p".as_ref(),
                port.as_ref(),
                "-U".as_ref(),
                "deermem".as_ref(),
                "-d".as_ref(),
                "postgres".as_ref(),
                "-v".as_ref(),
                "ON_ERROR_STOP=1".as_ref(),
                "-c".as_ref(),
                sql.as_ref(),
            ],
        )?;
        check("psql (create the role)", &out)?;
        // The first matching line wins: the role's line goes before the trust lines.
        let hba = o.dir.path().join("data").join("pg_hba.conf");
        let current = std::fs::read_to_string(&hba)?;
        std::fs::write(
            &hba,
            format!("host all \"{role}\" 127.0.0.1/32 scram-sha-256\n{current}"),
        )?;
        let data = o.dir.path().join("data");
        let out = run(
            o.run_as.as_deref(),
            &o.bin.join("pg_ctl"),
            &["-D".as_ref(), data.as_os_str(), "reload".as_ref()],
        )?;
        check("pg_ctl reload", &out)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(o) = &self.owned {
            let data = o.dir.path().join("data");
            // Immediate: a test cluster has nothing to keep.
            let _ = run(
                o.run_as.as_deref(),
                &o.bin.join("pg_ctl"),
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-m".as_ref(),
                    "immediate".as_ref(),
                    "-w".as_ref(),
                    "stop".as_ref(),
                ],
            );
        }
    }
}

fn find_binaries() -> Result<PathBuf, PgClusterError> {
    let mut searched = Vec::new();
    let has = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os(BIN_ENV) {
        let dir = PathBuf::from(dir);
        if has(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    searched.push(root.join("<version>/bin"));
    if let Some((_, dir)) = versions.into_iter().rev().find(|(_, d)| has(d)) {
        return Ok(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has(&dir) {
            return Ok(dir);
        }
        searched.push(dir);
    }
    Err(PgClusterError::NoBinaries { searched })
}

fn is_root() -> bool {
    // The effective uid, without libc: `id -u` is on every machine that has PostgreSQL.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// `postgres` when that account exists, else `nobody`.
fn unprivileged_user() -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    if passwd.lines().any(|l| l.starts_with("postgres:")) {
        "postgres".into()
    } else {
        "nobody".into()
    }
}

fn chown_to(path: &Path, user: &str) -> Result<(), PgClusterError> {
    let out = Command::new("chown").arg(user).arg(path).output()?;
    check(&format!("chown {user}"), &out)
}

fn run(
    run_as: Option<&str>,
    program: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<Output, PgClusterError> {
    let mut cmd = match run_as {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.arg("-u").arg(user).arg("--").arg(program);
            c
        }
        None => Command::new(program),
    };
    cmd.args(args);
    // A cluster must not inherit the caller's PG* settings.
    for var in ["PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGDATABASE"] {
        cmd.env_remove(var);
    }
    cmd.current_dir("/");
    Ok(cmd.output()?)
}

fn check(what: &str, out: &Output) -> Result<(), PgClusterError> {
    if out.status.success() {
        Ok(())
    } else {
        Err(PgClusterError::Command {
            what: what.into(),
            output: output_text(out),
        })
    }
}

fn output_text(out: &Output) -> String {
    let mut s = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        s.push('\n');
        s.push_str(tail(stdout.trim(), 2000));
    }
    s
}

fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn free_port() -> Result<u16, PgClusterError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}
