//! Whole-root checks shared by the reliability tests: files of a tree with their bytes, the
//! leftovers an interrupted commit must not leave after recovery, and process measurements.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every regular file below `dir` (symlinks are listed, not followed) as
/// `relative path → bytes`. Missing directories read as empty.
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(dir)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| p.to_string_lossy().into_owned());
                let bytes = if ft.is_symlink() {
                    std::fs::read_link(&p)
                        .map(|t| t.to_string_lossy().into_owned().into_bytes())
                        .unwrap_or_default()
                } else {
                    std::fs::read(&p).unwrap_or_default()
                };
                out.insert(rel, bytes);
            }
        }
    }
    out
}

/// Every path (files and directories) below `dir`, relative, sorted.
pub fn paths(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(rel) = p.strip_prefix(dir) {
                out.push(rel.to_path_buf());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// What an interrupted commit may leave behind and recovery must remove: a journal, a
/// non-empty `.recovery/` directory, or an atomic-write temporary (`.<name>.<hex>.tmp`)
/// outside the non-canonical `.metadata/` sidecars. Returns the offending relative paths.
pub fn leftovers(user_dir: &Path) -> Vec<String> {
    paths(user_dir)
        .into_iter()
        .filter_map(|p| {
            let s = p.to_string_lossy().into_owned();
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bad = name == ".memory.journal.json"
                || (s.starts_with(".recovery/") && s.len() > ".recovery/".len())
                || (name.starts_with('.') && name.ends_with(".tmp") && !s.contains(".metadata"));
            bad.then_some(s)
        })
        .collect()
}

/// The Markdown fact files below a user directory, relative.
pub fn fact_files(user_dir: &Path) -> Vec<String> {
    paths(user_dir)
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|s| s.ends_with(".md") && s.contains("/facts/"))
        .collect()
}

/// The process's peak resident set size in KiB (`VmHWM`), when the platform reports it.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Whether `python3` with PyYAML is available; prints the reason when it is not.
pub fn python_with_yaml(test: &str) -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED {test}: python3 with PyYAML is not available");
    }
    ok
}
