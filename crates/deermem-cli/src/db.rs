//! `deermem db migrate`: the PostgreSQL schema of `storage_class: postgres`, applied or shown.

use serde_json::json;

use crate::args::DbCommand;
use crate::ctx::Ctx;
use crate::error::CliError;
use crate::output;

fn version_text(v: Option<i64>) -> String {
    v.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

pub(crate) async fn run(ctx: &Ctx, command: DbCommand) -> Result<(), CliError> {
    let DbCommand::Migrate { status } = command;
    let cfg = deermem::embedded::deermem_config(&ctx.memory().backend_config)
        .map_err(|e| CliError::invalid(e.to_string()))?;
    if status {
        let s = deermem::embedded::schema_status(&cfg, &deermem::process_env).await?;
        if ctx.global.json {
            return output::print_json(&json!({
                "schema": s.schema,
                "version": s.version,
                "known": s.known,
                "pending": s.version.is_none_or(|v| v < s.known),
                "newer": s.version.is_some_and(|v| v > s.known),
            }));
        }
        let state = match s.version {
            Some(v) if v > s.known => "NEWER than this build: upgrade DeerMem",
            Some(v) if v == s.known => "up to date",
            _ => "migrations pending (run `deermem db migrate`)",
        };
        return output::print_text(&format!(
            "schema:     {}\nversion:    {}\nthis build: {}\nstate:      {state}",
            s.schema,
            version_text(s.version),
            s.known
        ));
    }
    let m = deermem::embedded::migrate_schema(&cfg, &deermem::process_env).await?;
    if ctx.global.json {
        return output::print_json(&m);
    }
    let applied = if m.applied.is_empty() {
        "nothing to apply".to_owned()
    } else {
        format!(
            "applied {}",
            m.applied
                .iter()
                .map(|v| format!("V{v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    output::print_text(&format!(
        "schema {}: version {} -> {} ({applied})",
        m.schema,
        version_text(m.from),
        m.to
    ))
}
