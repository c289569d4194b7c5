//! Tidy: the project's structural rules, checked mechanically. Core and the Python-compatibility
//! crate stay I/O-free (dependency allowlists and banned APIs; pycompat depends on no DeerMem
//! crate), every Rust file opens with a `//!` line, every adapter crate runs
//! its port's contract suite from `tests/contract.rs`, adapters do not depend on each other (and
//! adapter support, `deermem-remote`, on no DeerMem crate but the core and pycompat), no
//! stub macros or ignored tests are committed, and nothing points outside the repository (a
//! user's clone has only what is committed).

use std::fs;
use std::path::{Path, PathBuf};

/// Dependencies `deermem-core` may use: all of them pure, none does I/O.
const CORE_ALLOWED_DEPS: &[&str] = &[
    "async-trait",
    // The Python-compatibility rules (itself pure: checked with the same banned APIs).
    "deermem-pycompat",
    "serde",
    "serde_json",
    "thiserror",
    "indexmap",
    "sha2",
    "hex",
    "caseless",
    // Optional, behind core's `schema` feature: derives JSON Schemas of the wire types
    // (compile-time code generation plus in-memory JSON values; no I/O).
    "schemars",
    // `ConfigSecret` holds a `SecretString`: a boxed string zeroed on drop (over `zeroize`,
    // memory writes only; no I/O).
    "secrecy",
];

/// Dependencies `deermem-pycompat` may use: pure, none does I/O, and no DeerMem crate (the
/// core depends on it).
const PYCOMPAT_ALLOWED_DEPS: &[&str] = &[
    "serde",
    "serde_json",
    // The lax config deserializer (`lax::de`): wrappers of a deserializer naming the key of a
    // bad value and the keys a struct did not read; pure.
    "serde_path_to_error",
    "serde_ignored",
    "thiserror",
    "indexmap",
    "caseless",
    // The YAML 1.1 codec: yaml-rust2's event parser and the resolver's regexes.
    "regex",
    "yaml-rust2",
];

/// The pure crates: their manifest's dependencies must be on the allowlist, and their sources
/// must not name an I/O, clock, environment or runtime API.
const PURE_CRATES: &[(&str, &[&str])] = &[
    ("deermem-core", CORE_ALLOWED_DEPS),
    ("deermem-pycompat", PYCOMPAT_ALLOWED_DEPS),
];

/// Text that must not appear in the pure crates' sources (I/O, clock, environment, runtime).
const CORE_BANNED_APIS: &[&str] = &[
    "std::fs",
    "std::net",
    "std::process",
    "std::env",
    "SystemTime::now",
    "Instant::now",
    "tokio::",
    "File::open",
    "File::create",
];

/// Crate-name prefixes of adapter crates (each implements one port).
const ADAPTER_PREFIXES: &[&str] = &[
    "deermem-storage-",
    "deermem-retrieval-",
    "deermem-llm-",
    "deermem-backend-",
    "deermem-store-",
    "deermem-embed-",
];

/// Crates whose code only people read the errors of (test support, harnesses): they may
/// return `Result<_, String>`. Library crates return typed errors; so do their `src/bin/`
/// programs only when they are not listed here (binaries are exempt everywhere).
const STRING_ERRORS_ALLOWED: &[&str] = &["deermem-testkit", "deermem-reliability", "deermem-bench"];

/// Runs every check; returns the list of problems found.
pub(crate) fn run(root: &Path) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    for (name, allowed) in PURE_CRATES {
        check_pure_dependencies(root, name, allowed, &mut problems);
        check_pure_sources(root, name, &mut problems);
    }
    check_rust_files(root, &mut problems);
    check_adapters(root, &mut problems);
    check_string_errors(root, &mut problems);
    check_outside_references(root, &mut problems);
    check_fuzz_lock(root, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// The fuzz crate is outside the workspace, so no workspace build notices when a dependency
/// change leaves its `Cargo.lock` behind: ask cargo whether the lock still resolves as it is.
fn check_fuzz_lock(root: &Path, problems: &mut Vec<String>) {
    let manifest = root.join("fuzz/Cargo.toml");
    if !manifest.is_file() {
        return;
    }
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => problems.push(format!(
            "fuzz/Cargo.lock is stale (run `cargo metadata --format-version 1 --manifest-path fuzz/Cargo.toml` and commit the lock): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => problems.push(format!("cannot run cargo to check fuzz/Cargo.lock: {e}")),
    }
}

/// The dependency names of one `[section]` of a Cargo.toml (a small line-based reader: our
/// manifests use one dependency per line).
fn section_dependencies(manifest: &str, section: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == format!("[{section}]");
            continue;
        }
        if inside
            && !t.is_empty()
            && !t.starts_with('#')
            && let Some((name, _)) = t.split_once('=')
        {
            let name = name.trim().trim_end_matches(".workspace").trim_matches('"');
            deps.push(name.to_owned());
        }
    }
    deps
}

fn check_pure_dependencies(root: &Path, name: &str, allowed: &[&str], problems: &mut Vec<String>) {
    let path = root.join("crates").join(name).join("Cargo.toml");
    let Ok(manifest) = fs::read_to_string(&path) else {
        problems.push(format!("cannot read {}", path.display()));
        return;
    };
    for section in ["dependencies", "build-dependencies"] {
        for dep in section_dependencies(&manifest, section) {
            if !allowed.contains(&dep.as_str()) {
                problems.push(format!(
                    "{name} depends on `{dep}`, which is not on its I/O-free allowlist (xtask/src/tidy.rs)"
                ));
            }
        }
    }
}

/// Every file below `dir`, skipping directories for which `skip_dir(name)` holds.
fn walk_files(dir: &Path, skip_dir: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !skip_dir(&name) {
                walk_files(&path, skip_dir, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Generated or data directories no rule reads.
fn is_generated_dir(name: &str) -> bool {
    matches!(name, "target" | "corpus" | "artifacts" | "bench-out")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut all = Vec::new();
    walk_files(
        dir,
        &|name| is_generated_dir(name) || name.starts_with('.'),
        &mut all,
    );
    out.extend(
        all.into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "rs")),
    );
}

fn check_pure_sources(root: &Path, name: &str, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    rust_files(&root.join("crates").join(name).join("src"), &mut files);
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for banned in CORE_BANNED_APIS {
                if code.contains(banned) {
                    problems.push(format!(
                        "{}:{}: {name} must not use `{banned}` (no I/O, clock or environment in a pure crate)",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
}

fn check_rust_files(root: &Path, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("xtask"), &mut files);
    let this_file = root.join("xtask/src/tidy.rs");
    let stub_markers = [
        concat!("todo", "!("),
        concat!("unimplemented", "!("),
        concat!("#[", "ignore"),
    ];
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            problems.push(format!("cannot read {}", file.display()));
            continue;
        };
        let first = text.lines().next().unwrap_or("");
        if !first.starts_with("//!") {
            problems.push(format!(
                "{}: the first line must be a `//!` comment saying what the file is for",
                file.display()
            ));
        }
        if file == this_file {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            for marker in stub_markers {
                if line.contains(marker) {
                    problems.push(format!(
                        "{}:{}: `{marker}` is not allowed (a stub or a skipped test is a defect)",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
}

/// Library code returns typed errors: `Result<_, String>` (an error only a person can read)
/// is allowed in binaries, test code and the crates of [`STRING_ERRORS_ALLOWED`].
fn check_string_errors(root: &Path, problems: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(root.join("crates")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if STRING_ERRORS_ALLOWED.contains(&name.as_str()) {
            continue;
        }
        let src = entry.path().join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            if file.starts_with(src.join("bin")) || file.ends_with("main.rs") {
                continue;
            }
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            // Test modules sit at the end of a file by the workspace's habit.
            let library = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            for (n, line) in library.lines().enumerate() {
                if returns_string_error(line) {
                    problems.push(format!(
                        "{}:{}: `Result<_, String>` in library code; return a typed error \
                         (thiserror) that says what went wrong",
                        file.display(),
                        n + 1
                    ));
                }
            }
        }
    }
}

/// Whether a line names a `Result` whose error type is `String`.
fn returns_string_error(line: &str) -> bool {
    let mut rest = line;
    while let Some(at) = rest.find("Result<") {
        let args = &rest[at + "Result<".len()..];
        let mut depth = 0usize;
        let mut last_comma = None;
        for (i, c) in args.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                ')' | ']' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => last_comma = Some(i),
                '>' if depth == 0 => {
                    if let Some(comma) = last_comma
                        && args[comma + 1..i].trim() == "String"
                    {
                        return true;
                    }
                    break;
                }
                '>' => depth -= 1,
                _ => {}
            }
        }
        rest = args;
    }
    false
}

fn check_adapters(root: &Path, problems: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(root.join("crates")) else {
        problems.push("cannot read crates/".into());
        return;
    };
    let mut adapters = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if ADAPTER_PREFIXES.iter().any(|p| name.starts_with(p)) {
            adapters.push(name);
        }
    }
    adapters.sort();
    for adapter in &adapters {
        let dir = root.join("crates").join(adapter);
        if !dir.join("tests/contract.rs").is_file() {
            problems.push(format!("crates/{adapter} is an adapter but has no tests/contract.rs running its port's contract suite"));
        }
        let Ok(manifest) = fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        for dep in section_dependencies(&manifest, "dependencies") {
            if adapters.contains(&dep) && &dep != adapter {
                problems.push(format!("crates/{adapter} depends on the adapter `{dep}`; adapters must not depend on each other"));
            }
        }
    }
    // Adapter support (the remote adapters' plumbing) sits beside the adapters, and the
    // application layers stack without reaching sideways: each may use only the DeerMem crates
    // listed for it (the pure Python-compatibility crate is allowed everywhere).
    let layers: [(&str, &[&str]); 3] = [
        ("deermem-remote", &["deermem-core"]),
        ("deermem-updater", &["deermem-core"]),
        ("deermem-engine", &["deermem-core", "deermem-updater"]),
    ];
    for (krate, allowed) in layers {
        let Ok(manifest) = fs::read_to_string(root.join("crates").join(krate).join("Cargo.toml"))
        else {
            problems.push(format!("cannot read crates/{krate}/Cargo.toml"));
            continue;
        };
        for dep in section_dependencies(&manifest, "dependencies") {
            if dep.starts_with("deermem")
                && dep != "deermem-pycompat"
                && !allowed.contains(&dep.as_str())
            {
                problems.push(format!(
                    "crates/{krate} depends on `{dep}`; it may depend on {} only",
                    allowed.join(", ")
                ));
            }
        }
    }
}

/// What a line may not contain: a path or variable naming material beside the repository, or a
/// section of a specification document that is not in it. Returns a description of the first
/// offence.
fn outside_reference(line: &str) -> Option<String> {
    let shared = concat!("../", "shared");
    if line.contains(shared) {
        return Some(format!("`{shared}` (material outside the repository)"));
    }
    let var = concat!("DEERMEM_", "SHARED_DIR");
    if line.contains(var) {
        return Some(format!("`{var}` (material outside the repository)"));
    }
    // `spec/<lowercase-or-dash name>.md`
    let mut rest = line;
    while let Some(at) = rest.find("spec/") {
        let after = &rest[at + 5..];
        let name_len = after
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || *b == b'-')
            .count();
        if name_len > 0 && after[name_len..].starts_with(".md") {
            return Some(format!(
                "`spec/{}.md` (a document the reader cannot open; describe the behaviour instead)",
                &after[..name_len]
            ));
        }
        rest = after;
    }
    // `§<digit>`: a section number of such a document.
    let section = '\u{a7}';
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == section && chars.peek().is_some_and(char::is_ascii_digit) {
            return Some(format!(
                "`{section}<n>` (a section of a document the reader cannot open)"
            ));
        }
    }
    None
}

/// Every committed-looking text file (outside `target/`, `.git/` and fuzz corpora) is checked
/// with [`outside_reference`]; this file, which names the patterns, is exempt.
fn check_outside_references(root: &Path, problems: &mut Vec<String>) {
    let mut files = Vec::new();
    walk_files(
        root,
        &|name| is_generated_dir(name) || name == ".git",
        &mut files,
    );
    files.sort();
    let this_file = root.join("xtask/src/tidy.rs");
    for file in files {
        if file == this_file {
            continue;
        }
        let Ok(text) = fs::read_to_string(&file) else {
            continue; // binary data
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = outside_reference(line) {
                let shown = file.strip_prefix(root).unwrap_or(&file);
                problems.push(format!("{}:{}: {what}", shown.display(), n + 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_string_errors_only_in_the_error_position() {
        assert!(returns_string_error("fn f() -> Result<(), String> {"));
        assert!(returns_string_error(
            "    r: Result<Vec<(u8, u8)>, String>,"
        ));
        assert!(returns_string_error(
            "x: io::Result<u8>, y: Result<Map<String, u8>, String>"
        ));
        assert!(!returns_string_error(
            "fn f() -> Result<BTreeMap<String, String>, E> {"
        ));
        assert!(!returns_string_error(
            "fn f() -> Result<String, ConfigError> {"
        ));
        assert!(!returns_string_error(
            "fn f() -> Result<(String, u8), Error> {"
        ));
        assert!(!returns_string_error("let r: io::Result<String> = x;"));
    }

    #[test]
    fn reads_dependency_sections() {
        let manifest = "[package]\nname = \"x\"\n[dependencies]\nserde.workspace = true\ntokio = { workspace = true }\n# c\n[dev-dependencies]\nproptest.workspace = true\n";
        assert_eq!(
            section_dependencies(manifest, "dependencies"),
            vec!["serde", "tokio"]
        );
        assert_eq!(
            section_dependencies(manifest, "dev-dependencies"),
            vec!["proptest"]
        );
    }

    #[test]
    fn flags_forbidden_dependencies_and_apis_of_the_pure_crates() {
        let dir = std::env::temp_dir().join(format!("deermem-tidy-{}", std::process::id()));
        let core = dir.join("crates/deermem-core");
        fs::create_dir_all(core.join("src")).unwrap();
        fs::write(
            core.join("Cargo.toml"),
            "[dependencies]\nserde.workspace = true\nreqwest.workspace = true\n",
        )
        .unwrap();
        fs::write(core.join("src/lib.rs"), "//! Core.\nuse std::fs;\n").unwrap();
        fs::write(core.join("src/bad.rs"), "fn x() {}\n").unwrap();
        let pycompat = dir.join("crates/deermem-pycompat");
        fs::create_dir_all(pycompat.join("src")).unwrap();
        fs::write(
            pycompat.join("Cargo.toml"),
            "[dependencies]\nserde.workspace = true\ndeermem-core.workspace = true\n",
        )
        .unwrap();
        fs::write(
            pycompat.join("src/lib.rs"),
            "//! Pycompat.\nfn n() { let _ = std::env::var(\"X\"); }\n",
        )
        .unwrap();
        let problems = run(&dir).unwrap_err();
        let _ = fs::remove_dir_all(&dir);
        assert!(
            problems.iter().any(|p| p.contains("`reqwest`")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("std::fs")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("deermem-pycompat") && p.contains("`deermem-core`")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("deermem-pycompat must not use `std::env`")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.contains("bad.rs") && p.contains("//!")),
            "{problems:?}"
        );
    }

    #[test]
    fn flags_references_outside_the_repository() {
        let flagged = [
            concat!("see ../", "shared/fixtures"),
            concat!("set DEERMEM_", "SHARED_DIR"),
            concat!("(spec/", "storage.md)"),
            concat!("spec/", "remote-backends.md"),
            "storage \u{a7}2.8",
        ];
        for line in flagged {
            assert!(outside_reference(line).is_some(), "{line}");
        }
        let fine = [
            "the OpenAPI spec/document",
            "spec/README",
            "shared/fixtures",
            "a \u{a7} sign alone",
            "",
        ];
        for line in fine {
            assert_eq!(outside_reference(line), None, "{line}");
        }
    }
}
