//! `deermem turns list|retry|drop`: the turn journal of the embedded engine, on a file root or
//! in PostgreSQL (`storage_class: postgres`: the `turn_journal` table the replicas share).
//! On a file root `list` reads the journal file without its lock, so it works beside a running
//! server; `retry` and `drop` take the journal (a running server holds it: use its
//! `/api/memory/turns` route then). In PostgreSQL all three work beside running replicas.
//! `retry` runs the retried turns at once.

use std::time::Duration;

use deermem_core::ports::turn_journal::{TurnFilter, TurnId, TurnItem, TurnState};
use deermem_storage_file::FileTurnJournal;

use crate::args::TurnsCommand;
use crate::ctx::{self, Ctx};
use crate::error::CliError;

fn line(i: &TurnItem) -> String {
    format!(
        "{}\t{}\t{}\t{}\tattempts={}\taccepted={}\t{}",
        i.id(),
        i.state.as_str(),
        i.identity.user.as_ref().map_or("-", |u| u.as_str()),
        i.identity.thread_id,
        i.attempts,
        i.accepted_at.to_iso_z(),
        i.last_error.as_deref().unwrap_or("")
    )
}

fn json(i: &TurnItem) -> serde_json::Value {
    serde_json::json!({
        "id": i.id().as_str(),
        "state": i.state.as_str(),
        "user_id": i.identity.user.as_ref().map(|u| u.as_str()),
        "agent": i.identity.agent.as_str(),
        "thread_id": i.identity.thread_id,
        "trace_id": i.identity.trace_id,
        "accepted_at": i.accepted_at.to_iso_z(),
        "attempts": i.attempts,
        "next_attempt_at": i.next_attempt_at.map(|t| t.to_iso_z()),
        "last_error": i.last_error,
        "messages": i.messages.len(),
    })
}

fn ids(raw: &[String]) -> Result<Vec<TurnId>, CliError> {
    raw.iter()
        .map(|r| TurnId::parse(r).map_err(|e| CliError::invalid(e.to_string())))
        .collect()
}

pub(crate) async fn run(ctx: &Ctx, command: TurnsCommand) -> Result<(), CliError> {
    match command {
        TurnsCommand::List {
            user,
            dead,
            json: as_json,
        } => {
            let filter = TurnFilter {
                user: user.as_deref().map(ctx::user).transpose()?,
                state: dead.then_some(TurnState::Dead),
            };
            let postgres = ctx
                .memory()
                .backend_config
                .get("storage_class")
                .and_then(serde_json::Value::as_str)
                == Some("postgres");
            let items = if postgres {
                // The `turn_journal` table every replica shares, read beside them.
                let backend = ctx.backend()?;
                let Some(journal) = backend.deermem().and_then(|dm| dm.turn_journal().cloned())
                else {
                    return Err(CliError::invalid(
                        "this backend keeps no turn journal (queue.durable is off)",
                    ));
                };
                let items = journal
                    .list(&TurnFilter::default())
                    .await
                    .map_err(|e| CliError::failure(e.to_string()))?;
                backend.manager().close().await;
                items
            } else {
                let root = ctx.storage_root();
                tokio::task::spawn_blocking(move || FileTurnJournal::read_items(&root))
                    .await
                    .map_err(|e| CliError::failure(e.to_string()))?
                    .map_err(|e| CliError::failure(e.to_string()))?
            };
            let shown: Vec<&TurnItem> = items.iter().filter(|i| filter.matches(i)).collect();
            if as_json {
                let all: Vec<serde_json::Value> = shown.iter().map(|i| json(i)).collect();
                println!("{}", serde_json::Value::Array(all));
            } else {
                for i in shown {
                    println!("{}", line(i));
                }
            }
            Ok(())
        }
        TurnsCommand::Retry { ids: raw, all_dead } => {
            let wanted = ids(&raw)?;
            let backend = ctx.backend()?;
            let Some(dm) = backend.deermem().cloned() else {
                return Err(CliError::invalid("this backend keeps no turn journal"));
            };
            let Some(journal) = dm.turn_journal().cloned() else {
                return Err(CliError::invalid(
                    "this backend keeps no turn journal (queue.durable is off)",
                ));
            };
            let mut targets = wanted;
            if all_dead {
                let dead = journal
                    .list(&TurnFilter {
                        user: None,
                        state: Some(TurnState::Dead),
                    })
                    .await
                    .map_err(|e| CliError::failure(e.to_string()))?;
                targets.extend(dead.iter().map(|i| i.id().clone()));
            }
            let mut retried = 0usize;
            for id in &targets {
                match journal.retry(id).await {
                    Ok(Some(_)) => retried += 1,
                    Ok(None) => eprintln!("deermem: {id} is not a dead turn; skipped"),
                    Err(e) => return Err(CliError::failure(e.to_string())),
                }
            }
            // Run them now: queue the journal's pending turns and drain.
            dm.recover_turns()
                .await
                .map_err(|e| CliError::failure(e.to_string()))?;
            let manager = backend.manager();
            let budget = Duration::from_secs_f64(ctx.memory().shutdown_flush_timeout_seconds);
            let drained = manager.shutdown_flush(budget).await;
            manager.close().await;
            let left = journal
                .list(&TurnFilter::default())
                .await
                .map_err(|e| CliError::failure(e.to_string()))?;
            println!(
                "retried {retried} turn(s); {} left in the journal ({} dead){}",
                left.len(),
                left.iter().filter(|i| i.state == TurnState::Dead).count(),
                if drained {
                    ""
                } else {
                    "; the drain ran out of time"
                }
            );
            Ok(())
        }
        TurnsCommand::Drop { ids: raw } => {
            let wanted = ids(&raw)?;
            let backend = ctx.backend()?;
            let Some(journal) = backend.deermem().and_then(|dm| dm.turn_journal().cloned()) else {
                return Err(CliError::invalid("this backend keeps no turn journal"));
            };
            for id in &wanted {
                match journal.drop_turn(id).await {
                    Ok(true) => println!("dropped {id}"),
                    Ok(false) => eprintln!("deermem: no turn {id}"),
                    Err(e) => return Err(CliError::failure(e.to_string())),
                }
            }
            backend.manager().close().await;
            Ok(())
        }
    }
}
