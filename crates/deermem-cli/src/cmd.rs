//! The data commands: facts, summaries, export/import, search, index and migrate.

use std::io::{IsTerminal, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use deermem_core::ports::{FactPatch, MemoryManager, NewFact, SearchRequest};
use deermem_core::{AgentName, PublicMemoryDocument, UserId};
use serde_json::json;

use crate::args::{FactsCommand, IndexCommand, MigrateArgs, ScopeArgs};
use crate::ctx::{self, Ctx};
use crate::error::{CliError, Kind};
use crate::output;
use deermem_core::prelude::*;

/// Drains and closes a manager after a command that may have queued work.
pub(crate) async fn finish(manager: &Arc<dyn MemoryManager>, ctx: &Ctx) {
    let budget = Duration::from_secs_f64(ctx.memory().shutdown_flush_timeout_seconds);
    if !manager.shutdown_flush(budget).await {
        tracing::warn!("pending memory updates did not finish within {budget:?}");
    }
    manager.close().await;
}

/// The failure count a manager reports now (0 when it keeps no record).
fn failures_seen(manager: &Arc<dyn MemoryManager>) -> u64 {
    manager.last_backend_failure().map_or(0, |f| f.count)
}

/// After a read that came back empty or succeeded under a fail-open policy: when the backend
/// recorded a failure during it, nothing could be read, and the command fails with one line
/// (exit 8) instead of printing empty memory.
fn failed_open(manager: &Arc<dyn MemoryManager>, seen_before: u64) -> Result<(), CliError> {
    match manager.last_backend_failure() {
        Some(f) if f.count > seen_before => Err(CliError::new(
            Kind::Unavailable,
            format!(
                "{}; no memory could be read (failure_policy.read: fail_open)",
                output::one_line(&f.message, 400)
            ),
        )),
        _ => Ok(()),
    }
}

fn find_fact<'a>(doc: &'a PublicMemoryDocument, id: &str) -> Option<&'a deermem_core::PublicFact> {
    doc.facts.iter().find(|f| f.id == id)
}

pub(crate) async fn facts(ctx: &Ctx, command: FactsCommand) -> Result<(), CliError> {
    let manager = ctx.manager()?;
    let result = facts_inner(ctx, &manager, command).await;
    finish(&manager, ctx).await;
    result
}

async fn facts_inner(
    ctx: &Ctx,
    manager: &Arc<dyn MemoryManager>,
    command: FactsCommand,
) -> Result<(), CliError> {
    let json = ctx.global.json;
    match command {
        FactsCommand::List { scope } => {
            let doc = manager.get_memory(ctx::scope(&scope)?).await?;
            let mut facts = doc.facts;
            facts.sort_by(|a, b| a.id.cmp(&b.id));
            output::print(json, &facts, || output::facts_table(&facts))
        }
        FactsCommand::Get { id, scope } => {
            let doc = manager.get_memory(ctx::scope(&scope)?).await?;
            let fact = find_fact(&doc, &id).ok_or_else(|| {
                CliError::new(
                    Kind::NotFound,
                    format!("no fact {id:?} for this user and agent"),
                )
            })?;
            output::print(json, fact, || output::fact_details(fact))
        }
        FactsCommand::Add {
            scope,
            content,
            category,
            confidence,
        } => {
            let (doc, id) = manager
                .create_fact(
                    NewFact {
                        content,
                        category,
                        confidence,
                    },
                    ctx::scope(&scope)?,
                )
                .await?;
            let id = id.ok_or_else(|| {
                CliError::new(Kind::Conflict, "the fact was not stored because the configured memory.max_facts capacity policy evicted it")
            })?;
            let fact = find_fact(&doc, &id).ok_or_else(|| {
                CliError::failure(format!(
                    "the new fact {id} is missing from the returned document"
                ))
            })?;
            output::print(json, fact, || {
                format!("added {id}\n{}", output::fact_details(fact))
            })
        }
        FactsCommand::Update {
            id,
            scope,
            content,
            category,
            confidence,
            expected_revision,
        } => {
            let patch = FactPatch {
                content,
                category,
                confidence,
                expected_revision,
            };
            let doc = manager.update_fact(&id, patch, ctx::scope(&scope)?).await?;
            let fact = find_fact(&doc, &id).ok_or_else(|| {
                CliError::failure(format!("fact {id} is missing from the returned document"))
            })?;
            output::print(json, fact, || {
                format!("updated {id}\n{}", output::fact_details(fact))
            })
        }
        FactsCommand::Delete {
            id,
            scope,
            expected_revision,
        } => {
            manager
                .delete_fact(&id, expected_revision, ctx::scope(&scope)?)
                .await?;
            let value = json!({"id": id, "status": "deleted"});
            output::print(json, &value, || format!("deleted {id}"))
        }
    }
}

pub(crate) async fn summaries(ctx: &Ctx, user: &str) -> Result<(), CliError> {
    let manager = ctx.manager()?;
    let scope = deermem_core::ports::MemoryScope::new(Some(ctx::user(user)?), None);
    let result = manager.get_memory(scope).await;
    finish(&manager, ctx).await;
    let doc = result?;
    let value = json!({"user": doc.user, "history": doc.history, "revision": doc.revision});
    output::print(ctx.global.json, &value, || output::summaries_text(&doc))
}

/// The export document is the `get_memory` document, as the gateway's `/api/memory/export`.
pub(crate) async fn export(ctx: &Ctx, scope: &ScopeArgs) -> Result<(), CliError> {
    let manager = ctx.manager()?;
    let result = manager.get_memory(ctx::scope(scope)?).await;
    finish(&manager, ctx).await;
    output::print_json(&result?.for_http())
}

fn read_input(file: &Path) -> Result<String, CliError> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| CliError::failure(format!("cannot read stdin: {e}")))?;
        return Ok(s);
    }
    std::fs::read_to_string(file)
        .map_err(|e| CliError::failure(format!("cannot read {}: {e}", file.display())))
}

pub(crate) async fn import(ctx: &Ctx, scope: &ScopeArgs, file: &Path) -> Result<(), CliError> {
    let text = read_input(file)?;
    // Counted on the text, before thousands of facts are built only to be refused.
    if let Some(count) =
        deermem::import_fact_count(text.as_bytes()).filter(|n| *n > deermem_core::MAX_IMPORT_FACTS)
    {
        return Err(CliError::invalid(format!(
            "{} holds {count} facts; an import document may hold at most {}",
            file.display(),
            deermem_core::MAX_IMPORT_FACTS
        )));
    }
    let doc: PublicMemoryDocument = serde_json::from_str(&text).map_err(|e| {
        CliError::invalid(format!("{} is not a memory document: {e}", file.display()))
    })?;
    let manager = ctx.manager()?;
    let result = manager.import_memory(doc, ctx::scope(scope)?).await;
    finish(&manager, ctx).await;
    let doc = result?;
    if ctx.global.json {
        output::print_json(&doc.for_http())
    } else {
        output::print_text(&format!(
            "imported {} fact(s); revision {}",
            doc.facts.len(),
            doc.revision.unwrap_or(0)
        ))
    }
}

pub(crate) async fn search(
    ctx: &Ctx,
    scope: &ScopeArgs,
    query: String,
    top_k: usize,
    category: Option<String>,
    mode: Option<deermem_core::SearchMode>,
) -> Result<(), CliError> {
    let manager = ctx.manager()?;
    let request = SearchRequest {
        query,
        top_k,
        scope: ctx::scope(scope)?,
        category,
        mode,
    };
    let seen = failures_seen(&manager);
    let result = manager.search_scored(request).await;
    finish(&manager, ctx).await;
    let hits = result?;
    failed_open(&manager, seen)?;
    if ctx.global.json {
        let rows: Vec<_> = hits
            .iter()
            .map(|h| {
                json!({
                    "id": h.fact.id,
                    "content": h.fact.content,
                    "category": h.fact.category,
                    "score": h.score,
                    "matchType": h.match_type.as_str(),
                })
            })
            .collect();
        return output::print_json(&rows);
    }
    if hits.is_empty() {
        return output::print_text("(no matches)");
    }
    let mut out = String::new();
    for (i, h) in hits.iter().enumerate() {
        let score = h
            .score
            .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}"));
        out.push_str(&format!(
            "{:>2}. [{}] {} ({}, score {score}, {})\n",
            i + 1,
            h.fact.category,
            output::one_line(&h.fact.content, 100),
            h.fact.id,
            h.match_type.as_str()
        ));
    }
    output::print_text(&out)
}

fn deermem_config(ctx: &Ctx) -> Result<deermem_updater::DeerMemConfig, CliError> {
    if ctx.memory().manager_class != "deermem" {
        return Err(CliError::new(
            Kind::Unsupported,
            format!(
                "this command works on the embedded DeerMem storage; memory.manager_class is {:?}",
                ctx.memory().manager_class
            ),
        ));
    }
    deermem::embedded::deermem_config(&ctx.memory().backend_config)
        .map_err(|e| CliError::invalid(e.to_string()))
}

/// The file store, for the commands only it has (`migrate`); any other storage class is a
/// typed refusal (exit 6), never files written beside a database.
fn open_storage(
    ctx: &Ctx,
    with_retrieval: bool,
) -> Result<deermem_storage_file::FileStorage, CliError> {
    let cfg = deermem_config(ctx)?;
    require_file_storage(&cfg, "`deermem migrate` (legacy file layouts)")?;
    let root = ctx.storage_root();
    Ok(deermem::embedded::open_storage(
        &cfg,
        root,
        Arc::new(deermem::SystemClock),
        with_retrieval,
    )?)
}

/// Refuses an operation of the file store's layout when the configuration selects another
/// storage class.
fn require_file_storage(
    cfg: &deermem_updater::DeerMemConfig,
    operation: &'static str,
) -> Result<(), CliError> {
    let class =
        deermem::embedded::storage_class(cfg).map_err(|e| CliError::invalid(e.to_string()))?;
    match class {
        deermem::embedded::StorageClass::File => Ok(()),
        other => Err(CliError::new(
            Kind::Unsupported,
            format!(
                "{operation} is not available on storage {}; it works on the file storage's layout only",
                other.as_str()
            ),
        )),
    }
}

/// The configured embedded storage (files or PostgreSQL), for the administrative commands.
fn open_embedded(
    ctx: &Ctx,
    with_retrieval: bool,
) -> Result<deermem::embedded::EmbeddedStorage, CliError> {
    let cfg = deermem_config(ctx)?;
    let root = ctx.storage_root();
    Ok(deermem::embedded::open_embedded(
        &cfg,
        root,
        Arc::new(deermem::SystemClock),
        with_retrieval,
        &deermem::process_env,
    )?)
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_owned());
    bar
}

pub(crate) async fn index(ctx: &Ctx, command: IndexCommand) -> Result<(), CliError> {
    let embedded = open_embedded(ctx, true)?;
    let result = index_inner(ctx, &embedded, command).await;
    embedded.storage().close().await;
    result
}

async fn index_inner(
    ctx: &Ctx,
    embedded: &deermem::embedded::EmbeddedStorage,
    command: IndexCommand,
) -> Result<(), CliError> {
    let storage = embedded.storage();
    match command {
        IndexCommand::Rebuild { user, agent } => {
            let status = storage.retrieval_status().await;
            if !status.configured {
                return Err(CliError::new(
                    Kind::Unsupported,
                    "no search index is configured (retrieval_adapter is empty)",
                ));
            }
            let scopes: Option<Vec<(Option<UserId>, AgentName)>> = match (user, agent) {
                (None, _) => None,
                (Some(u), Some(a)) => Some(vec![(Some(ctx::user(&u)?), AgentName::parse(&a)?)]),
                (Some(u), None) => {
                    let uid = ctx::user(&u)?;
                    let agents = embedded.agents_of(&uid).await?;
                    Some(agents.into_iter().map(|a| (Some(uid.clone()), a)).collect())
                }
            };
            let bar = progress(
                scopes.as_ref().map_or(1, |s| s.len() as u64),
                "rebuilding index",
            );
            let report = match &scopes {
                None => {
                    let r = storage.rebuild_index(None).await?;
                    bar.inc(1);
                    r
                }
                Some(list) => {
                    let mut total = deermem_core::RebuildReport {
                        supported: true,
                        ..Default::default()
                    };
                    for scope in list {
                        let r = storage
                            .rebuild_index(Some(std::slice::from_ref(scope)))
                            .await?;
                        total.indexed += r.indexed;
                        total.failed += r.failed;
                        total.fatal |= r.fatal;
                        bar.inc(1);
                    }
                    total
                }
            };
            bar.finish_and_clear();
            output::print(ctx.global.json, &report, || {
                format!(
                    "indexed {} fact(s), {} failed{}",
                    report.indexed,
                    report.failed,
                    if report.fatal { " (FATAL)" } else { "" }
                )
            })?;
            if report.fatal {
                let cause = storage
                    .retrieval_status()
                    .await
                    .last_error
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(CliError::failure(format!(
                    "the index rebuild failed{cause}; search falls back to a substring scan until a rebuild succeeds"
                )));
            }
            Ok(())
        }
        IndexCommand::Status => {
            let status = storage.retrieval_status().await;
            // Compare the index with the files: only this can notice facts committed by a
            // process that died before its index write (no record of that exists anywhere).
            let verification = if status.configured && status.total_docs.is_some() {
                match embedded.verify_index().await {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not compare the index with the fact files");
                        None
                    }
                }
            } else {
                None
            };
            if ctx.global.json {
                let mut value = serde_json::to_value(&status).map_err(|e| {
                    CliError::failure(format!("cannot encode the index status: {e}"))
                })?;
                if let (Some(map), Some(v)) = (value.as_object_mut(), &verification) {
                    let v = serde_json::to_value(v).map_err(|e| {
                        CliError::failure(format!("cannot encode the index check: {e}"))
                    })?;
                    map.insert("verification".into(), v);
                }
                return output::print_json(&value);
            }
            let mut out = format!(
                "configured: {}\nmode:       {}\n",
                status.configured, status.mode
            );
            if let Some(a) = &status.adapter {
                out.push_str(&format!("adapter:    {a}\n"));
            }
            if status.configured && status.total_docs.is_none() {
                // The adapter could not report statistics: it is unusable right now.
                out.push_str(
                    "state:      unavailable (search uses the substring scan until the index opens or a rebuild succeeds)\n",
                );
            }
            if let Some(n) = status.total_docs {
                out.push_str(&format!("documents:  {n}\n"));
            }
            if let Some(p) = &status.db_path {
                out.push_str(&format!("path:       {p}\n"));
            }
            if let Some(b) = status.db_bytes {
                out.push_str(&format!("size:       {b} bytes\n"));
            }
            out.push_str(&format!(
                "dirty:      {}\n",
                if status.dirty_scopes.is_empty() {
                    "none".to_owned()
                } else {
                    status.dirty_scopes.join(", ")
                }
            ));
            if let Some(v) = &verification {
                if v.stale_scopes.is_empty() {
                    out.push_str(&format!(
                        "files:      in sync ({} fact(s) on disk, all indexed)\n",
                        v.canonical_facts
                    ));
                } else {
                    let scopes: Vec<String> = v
                        .stale_scopes
                        .iter()
                        .map(|s| {
                            format!(
                                "{} ({} missing, {} extra, {} outdated)",
                                s.scope, s.missing, s.extra, s.outdated
                            )
                        })
                        .collect();
                    out.push_str(&format!(
                        "files:      OUT OF SYNC: {} fact(s) on disk, {} indexed; {}; run `deermem index rebuild` (searches of these scopes still find every fact through the fallback)\n",
                        v.canonical_facts,
                        v.indexed_docs,
                        scopes.join(", ")
                    ));
                }
                if v.unreadable_facts > 0 {
                    out.push_str(&format!(
                        "unreadable: {} fact file(s) (see the warnings above)\n",
                        v.unreadable_facts
                    ));
                }
            }
            if let Some(v) = &status.vectors {
                out.push_str(&vector_lines(v));
            }
            if let Some(e) = &status.last_error {
                out.push_str(&format!("last error: {e}\n"));
            }
            output::print_text(&out)
        }
    }
}

/// The vector coverage lines of `deermem index status`.
fn vector_lines(v: &deermem_core::VectorCoverage) -> String {
    let mut out = format!(
        "vectors:    {}/{} embedded (model {}, {} dimensions)\n",
        v.embedded, v.total, v.model_id, v.dimension
    );
    out.push_str(&format!(
        "embedding:  {}\n",
        if v.pending_scopes.is_empty() {
            "no scope pending".to_owned()
        } else {
            format!(
                "pending for {} (searched by BM25 until re-embedded)",
                v.pending_scopes.join(", ")
            )
        }
    ));
    if let Some(e) = &v.last_error {
        out.push_str(&format!("embed error: {e}\n"));
    }
    out
}

/// `deermem migrate`: returns the process exit status (0, or 1 when any user failed).
pub(crate) async fn migrate(ctx: &Ctx, args: MigrateArgs) -> Result<u8, CliError> {
    if let (Some(from), Some(to)) = (&args.from, &args.to) {
        return crate::transfer::run(ctx, from, to, &args).await;
    }
    if args.user_isolation {
        return migrate_isolation(ctx, &args);
    }
    // A dry run writes nothing, not even the derived index file.
    let storage = open_storage(ctx, !args.dry_run)?;
    let root = ctx.storage_root();
    let mut lines = vec![format!("Storage root: {}", root.display())];
    let users: Vec<UserId> = if args.all_users {
        storage.list_users().await?
    } else {
        let mut seen = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for raw in &args.user_id {
            let u = ctx::user(raw)?;
            if seen.insert(u.as_str().to_owned()) {
                out.push(u);
            }
        }
        out
    };
    if users.is_empty() {
        lines.push("No user buckets found; nothing to migrate.".to_owned());
        storage.close().await;
        let value = json!({"root": root, "users": [], "summary": {"migrated": 0, "planned": 0, "current": 0, "failed": 0}});
        output::print(ctx.global.json, &value, || lines.join("\n"))?;
        return Ok(0);
    }
    let manifest_name = deermem_config(ctx)?.manifest_filename;
    let (mut migrated, mut planned, mut current, mut failed) = (0, 0, 0, 0);
    let mut rows = Vec::new();
    let bar = progress(users.len() as u64, "migrating");
    for user in &users {
        let path = root.join("users").join(user.bucket()).join(&manifest_name);
        let result = storage
            .migrate(Some(user), &AgentName::default_bucket(), args.dry_run)
            .await;
        let (status, line) = match result {
            Ok(r) if r.migrated && args.dry_run => {
                planned += 1;
                (
                    "planned",
                    format!("{user}: would migrate {}", path.display()),
                )
            }
            Ok(r) if r.migrated => {
                migrated += 1;
                (
                    "migrated",
                    format!(
                        "{user}: migrated {} ({} -> {})",
                        path.display(),
                        r.from_version.as_deref().unwrap_or("none"),
                        r.to_version
                    ),
                )
            }
            Ok(_) => {
                current += 1;
                ("current", format!("{user}: already current"))
            }
            Err(e) => {
                failed += 1;
                ("failed", format!("{user}: FAILED: {e}"))
            }
        };
        rows.push(
            json!({"user": user.as_str(), "bucket": user.bucket(), "status": status, "line": line}),
        );
        lines.push(line);
        bar.inc(1);
    }
    bar.finish_and_clear();
    storage.close().await;
    let summary =
        format!("Summary: migrated={migrated} planned={planned} current={current} failed={failed}");
    lines.push(summary);
    let value = json!({"root": root, "users": rows, "summary": {"migrated": migrated, "planned": planned, "current": current, "failed": failed}});
    output::print(ctx.global.json, &value, || lines.join("\n"))?;
    Ok(u8::from(failed > 0))
}

fn migrate_isolation(ctx: &Ctx, args: &MigrateArgs) -> Result<u8, CliError> {
    if args.user_id.len() > 1 {
        return Err(CliError::invalid(
            "--user-isolation assigns the shared layout to one user: give at most one --user-id",
        ));
    }
    let user = match args.user_id.first() {
        Some(raw) => ctx::user(raw)?,
        None => UserId::default_user(),
    };
    let manifest_filename = match ctx.memory().manager_class.as_str() {
        "deermem" => deermem_config(ctx)?.manifest_filename,
        _ => "memory.json".to_owned(),
    };
    if ctx.memory().manager_class == "deermem" {
        require_file_storage(
            &deermem_config(ctx)?,
            "`deermem migrate --user-isolation` (the shared file layout)",
        )?;
    }
    let root = ctx.storage_root();
    let options = deermem_storage_file::isolation::IsolationOptions {
        dry_run: args.dry_run,
        manifest_filename,
    };
    let report = deermem_storage_file::isolation::migrate_user_isolation(&root, &user, &options)?;
    if ctx.global.json {
        let s = report.summary();
        let items: Vec<_> = report
            .items
            .iter()
            .map(|i| {
                json!({
                    "kind": i.kind.to_string(),
                    "source": i.source,
                    "destination": i.destination,
                    "action": i.action.label(),
                    "line": i.to_string(),
                })
            })
            .collect();
        output::print_json(&json!({
            "root": report.root,
            "bucket": report.bucket,
            "dryRun": report.dry_run,
            "items": items,
            "summary": {"migrated": s.migrated, "conflicts": s.conflicts, "planned": s.planned, "current": s.current, "failed": s.failed},
        }))?;
    } else {
        output::print_text(&report.to_string())?;
    }
    Ok(u8::from(report.has_failures()))
}

/// Reads a conversation: a JSON list of messages, or an object with a `messages` list (a
/// DeerFlow/LangChain state or dump).
pub(crate) fn read_messages(file: &Path) -> Result<Vec<deermem_core::Message>, CliError> {
    let text = read_input(file)?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| CliError::invalid(format!("{} is not JSON: {e}", file.display())))?;
    let list = match value {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(mut o) => match o.remove("messages") {
            Some(serde_json::Value::Array(items)) => items,
            _ => {
                return Err(CliError::invalid(format!(
                    "{}: expected a list of messages or an object with a \"messages\" list",
                    file.display()
                )));
            }
        },
        _ => {
            return Err(CliError::invalid(format!(
                "{}: expected a list of messages",
                file.display()
            )));
        }
    };
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            serde_json::from_value(m)
                .map_err(|e| CliError::invalid(format!("{}: message {i}: {e}", file.display())))
        })
        .collect()
}

fn ingest_report_text(report: &deermem_engine::IngestReport) -> String {
    let mut out = String::new();
    let status = serde_json::to_value(report.status)
        .ok()
        .and_then(|v| v.get("status").and_then(|s| s.as_str()).map(str::to_owned))
        .unwrap_or_default();
    out.push_str(&format!("status: {status}"));
    if let Some(origin) = &report.origin {
        out.push_str(&format!(" (extraction: {origin})"));
    }
    out.push('\n');
    if !report.signals.is_empty() {
        out.push_str(&format!("signals: {}\n", report.signals.join(", ")));
    }
    for a in &report.added {
        out.push_str(&format!(
            "+ added   {} [{} {:.2}] {}\n",
            a.id,
            a.category,
            a.confidence,
            output::one_line(&a.content, 100)
        ));
    }
    for r in &report.removed {
        let reason = serde_json::to_value(r.reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        out.push_str(&format!("- removed {} ({reason})\n", r.id));
    }
    for r in &report.rejected {
        let v = serde_json::to_value(r).unwrap_or(serde_json::Value::Null);
        out.push_str(&format!(
            "x rejected {}\n",
            output::one_line(&v.to_string(), 160)
        ));
    }
    for s in &report.summaries_updated {
        out.push_str(&format!("~ summary {s}\n"));
    }
    if report.added.is_empty()
        && report.removed.is_empty()
        && report.rejected.is_empty()
        && report.summaries_updated.is_empty()
    {
        out.push_str("(no changes)\n");
    }
    out
}

pub(crate) async fn ingest(
    ctx: &Ctx,
    scope: &ScopeArgs,
    thread: String,
    file: &Path,
) -> Result<(), CliError> {
    let messages = read_messages(file)?;
    let backend = ctx.backend()?;
    let request = deermem_core::ports::AddRequest {
        thread_id: thread,
        messages,
        scope: ctx::scope(scope)?,
        trace_id: None,
    };
    let manager = backend.manager();
    let result = match (&backend, backend.deermem()) {
        (_, Some(dm)) => {
            let report = dm.ingest_now(request).await;
            report.map(Some)
        }
        // OpenViking: capture now and report what reached the server, or why nothing (or not
        // everything) did, whatever the write policy says.
        (deermem::Backend::OpenViking(ov), None) => {
            let (report, result) = ov.capture_now(request).await;
            finish(&manager, ctx).await;
            let found = if report.found_on_server > 0 {
                format!(
                    "; {} message(s) of an earlier unanswered batch were already there",
                    report.found_on_server
                )
            } else {
                String::new()
            };
            if let Err(e) = result {
                let mut err = CliError::from(e);
                err.message = format!(
                    "{} ({} message(s) reached the server before the failure{found})",
                    output::one_line(&err.message, 600),
                    report.sent
                );
                return Err(err);
            }
            return if ctx.global.json {
                output::print_json(&json!({"status": "sent", "backend": backend.class(),
                    "sent": report.sent, "found_on_server": report.found_on_server}))
            } else {
                output::print_text(&format!(
                    "sent {} message(s) to the {} backend{found}",
                    report.sent,
                    backend.class()
                ))
            };
        }
        (_, None) => {
            let n = request.messages.len();
            let r = manager.add_nowait(request).await.map(|()| None);
            if r.is_ok() && !ctx.global.json {
                output::print_text(&format!(
                    "sent {n} message(s) to the {} backend",
                    backend.class()
                ))?;
            }
            r
        }
    };
    finish(&manager, ctx).await;
    match result? {
        Some(report) if ctx.global.json => output::print_json(&report),
        Some(report) => output::print_text(&ingest_report_text(&report)),
        None if ctx.global.json => {
            output::print_json(&json!({"status": "sent", "backend": backend.class()}))
        }
        None => Ok(()),
    }
}

pub(crate) async fn context(ctx: &Ctx, scope: &ScopeArgs) -> Result<(), CliError> {
    let manager = ctx.manager()?;
    let request = deermem_core::ports::ContextRequest {
        scope: ctx::scope(scope)?,
        thread_id: None,
    };
    let seen = failures_seen(&manager);
    let result = manager.get_context_block(request).await;
    finish(&manager, ctx).await;
    let block = result?;
    failed_open(&manager, seen)?;
    if ctx.global.json {
        output::print_json(&json!({"context": block.block, "content_sha256": block.content_sha256}))
    } else if block.block.is_empty() {
        output::print_text("(no memory to inject)")
    } else {
        output::print_text(&block.block)
    }
}

#[cfg(test)]
mod tests {
    use super::vector_lines;

    #[test]
    fn vector_coverage_lines_name_model_counts_pending_scopes_and_the_error() {
        let mut v = deermem_core::VectorCoverage {
            model_id: "all-MiniLM-L6-v2".into(),
            dimension: 384,
            embedded: 2,
            total: 3,
            pending_scopes: vec![],
            last_error: None,
        };
        assert_eq!(
            vector_lines(&v),
            "vectors:    2/3 embedded (model all-MiniLM-L6-v2, 384 dimensions)\nembedding:  no scope pending\n"
        );
        v.pending_scopes = vec!["alice|__default__".into(), "bob|coder".into()];
        v.last_error = Some("embedding server unavailable".into());
        assert_eq!(
            vector_lines(&v),
            "vectors:    2/3 embedded (model all-MiniLM-L6-v2, 384 dimensions)\nembedding:  pending for alice|__default__, bob|coder (searched by BM25 until re-embedded)\nembed error: embedding server unavailable\n"
        );
    }
}
