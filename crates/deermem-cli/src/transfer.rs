//! `deermem migrate --from <FROM> --to <TO>`: moves every user between the file store and
//! PostgreSQL (see `deermem::transfer`), printing one line per user bucket as it is done and
//! the totals with one checksum over all of them. Connection URLs are never printed.

use serde_json::json;

use deermem::transfer::{
    self, Endpoint, PgError, ScopeReport, ScopeStatus, TransferError, TransferOptions,
};

use crate::args::MigrateArgs;
use crate::ctx::Ctx;
use crate::error::{CliError, Kind};
use crate::output;

/// Runs the move; the exit status is 1 when any bucket failed or was refused.
pub(crate) async fn run(
    ctx: &Ctx,
    from: &str,
    to: &str,
    args: &MigrateArgs,
) -> Result<u8, CliError> {
    let schema = args.pg_schema.as_deref();
    let from = Endpoint::parse("--from", from, schema, &deermem::process_env).map_err(cli_error)?;
    let to = Endpoint::parse("--to", to, schema, &deermem::process_env).map_err(cli_error)?;
    let manifest_filename = match ctx.memory().manager_class.as_str() {
        "deermem" => {
            deermem::embedded::deermem_config(&ctx.memory().backend_config)
                .map_err(|e| CliError::invalid(e.to_string()))?
                .manifest_filename
        }
        _ => TransferOptions::default().manifest_filename,
    };
    let options = TransferOptions {
        overwrite: args.overwrite,
        manifest_filename,
    };
    let json_mode = ctx.global.json;
    if !json_mode {
        output::print_text(&format!("Moving {} -> {}", from.label(), to.label()))?;
    }
    let report = transfer::transfer(&from, &to, &options, |scope| {
        if !json_mode {
            // Progress as it happens; a closed stdout is reported by the summary's print.
            let _ = output::print_text(&line(scope));
        }
    })
    .await
    .map_err(cli_error)?;
    let totals = report.totals();
    let total_checksum = report.total_checksum();
    if json_mode {
        let scopes: Vec<_> = report
            .scopes
            .iter()
            .map(|s| {
                json!({
                    "bucket": s.bucket,
                    "status": s.status.label(),
                    "revision": s.revision,
                    "agents": s.counts.agents,
                    "facts": s.counts.facts,
                    "usage": s.counts.usage,
                    "audit": s.counts.audit,
                    "sha256": s.checksum,
                    "error": match &s.status {
                        ScopeStatus::Failed(e) => Some(e.to_string()),
                        _ => None,
                    },
                })
            })
            .collect();
        output::print_json(&json!({
            "from": report.from,
            "to": report.to,
            "scopes": scopes,
            "summary": {
                "scopes": report.scopes.len(),
                "copied": report.count("copied"),
                "unchanged": report.count("unchanged"),
                "failed": report.count("failed"),
                "agents": totals.agents,
                "facts": totals.facts,
                "usage": totals.usage,
                "audit": totals.audit,
                "sha256": total_checksum,
            },
        }))?;
    } else {
        output::print_text(&format!(
            "Total: {} users (copied={} unchanged={} failed={}), {} agents, {} facts, {} usage \
             entries, {} audit events; sha256 {total_checksum}",
            report.scopes.len(),
            report.count("copied"),
            report.count("unchanged"),
            report.count("failed"),
            totals.agents,
            totals.facts,
            totals.usage,
            totals.audit,
        ))?;
    }
    Ok(u8::from(report.has_failures()))
}

fn line(s: &ScopeReport) -> String {
    let c = s.counts;
    match &s.status {
        ScopeStatus::Failed(e) => format!("{}: FAILED: {e}", s.bucket),
        status => format!(
            "{}: {} (revision {}, {} agents, {} facts, {} usage, {} audit) sha256 {}",
            s.bucket,
            status.label(),
            s.revision,
            c.agents,
            c.facts,
            c.usage,
            c.audit,
            s.checksum
        ),
    }
}

fn cli_error(e: TransferError) -> CliError {
    let kind = match &e {
        TransferError::Endpoint { .. }
        | TransferError::SameEndpoint(_)
        | TransferError::NoSourceSchema { .. } => Kind::Invalid,
        TransferError::Postgres(PgError::Connect { .. } | PgError::Tls { .. }) => Kind::Unavailable,
        TransferError::Postgres(PgError::Config { .. } | PgError::Url { .. }) => Kind::Invalid,
        _ => Kind::Failure,
    };
    CliError::new(kind, e.to_string())
}
