//! `deermem demo`: the main job on embedded defaults. A temporary store, a short bundled
//! conversation ingested turn by turn (with the configured model, or the offline rule-based
//! extractor when none is configured), then the stored facts, a search and the `<memory>` block
//! a host would inject.

use deermem_core::ports::MemoryManagerExt as _;
use deermem_core::ports::{AddRequest, ContextRequest, MemoryManager, MemoryScope, SearchRequest};
use deermem_core::{Message, UserId};

use crate::ctx::Ctx;
use crate::error::CliError;
use crate::output;

const CONVERSATION: &str = include_str!("../demo/conversation.json");

fn turns() -> Result<Vec<Vec<Message>>, CliError> {
    serde_json::from_str(CONVERSATION)
        .map_err(|e| CliError::failure(format!("the bundled demo conversation is invalid: {e}")))
}

pub(crate) async fn run(ctx: &Ctx, keep: bool) -> Result<(), CliError> {
    let dir = tempfile::Builder::new()
        .prefix("deermem-demo-")
        .tempdir()
        .map_err(|e| CliError::failure(format!("cannot create a temporary store: {e}")))?;
    let mut config = ctx.memory().clone();
    config.manager_class = "deermem".into();
    config.mode = deermem_core::MemoryMode::Middleware;
    config.injection_enabled = true;
    let mut opts = ctx.build_options();
    opts.storage_path = Some(dir.path().to_path_buf());
    let backend =
        deermem::build_backend(&config, opts).map_err(|e| CliError::invalid(e.to_string()))?;
    let Some(dm) = backend.deermem() else {
        return Err(CliError::failure(
            "the demo needs the embedded DeerMem engine",
        ));
    };
    let manager: std::sync::Arc<dyn MemoryManager> = backend.manager();
    let user = UserId::new("demo-user").map_err(CliError::from)?;
    let scope = MemoryScope::new(Some(user), None);
    let json = ctx.global.json;
    let mut log = String::new();
    log.push_str(&format!(
        "DeerMem demo: a temporary store at {}\n",
        dir.path().display()
    ));
    let mut history: Vec<Message> = Vec::new();
    let mut reports = Vec::new();
    let result: Result<(), CliError> = async {
        for (i, turn) in turns()?.into_iter().enumerate() {
            history.extend(turn.iter().cloned());
            if !json {
                for m in &turn {
                    log.push_str(&format!(
                        "  {:<9} {}\n",
                        format!("{}:", m.kind.as_str()),
                        m.text()
                    ));
                }
            }
            let request = AddRequest {
                thread_id: "demo-thread".into(),
                messages: history.clone(),
                scope: scope.clone(),
                trace_id: None,
            };
            let report = dm.ingest_now(request).await?;
            if i == 0 && !json {
                log.push_str(&format!(
                    "  (extraction: {})\n",
                    report.origin.as_deref().unwrap_or("none")
                ));
            }
            if !json {
                for a in &report.added {
                    log.push_str(&format!(
                        "    + remembered [{}] {}\n",
                        a.category, a.content
                    ));
                }
                for r in &report.removed {
                    log.push_str(&format!("    - forgot {} ({:?})\n", r.id, r.reason));
                }
            }
            reports.push(report);
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        crate::cmd::finish(&manager, ctx).await;
        return Err(e);
    }
    let doc = manager.get_memory(scope.clone()).await?;
    let hits = manager
        .search_scored(SearchRequest {
            query: "乌龙茶 Rust".into(),
            top_k: 3,
            scope: scope.clone(),
            category: None,
            mode: None,
        })
        .await?;
    let block = manager
        .get_context_block(ContextRequest {
            scope: scope.clone(),
            thread_id: Some("demo-thread-2".into()),
        })
        .await?;
    crate::cmd::finish(&manager, ctx).await;
    let path = if keep { Some(dir.keep()) } else { None };
    if json {
        return output::print_json(&serde_json::json!({
            "store": path,
            "reports": reports,
            "facts": doc.facts,
            "search": {"query": "乌龙茶 Rust", "hits": hits},
            "context": block.block,
            "content_sha256": block.content_sha256,
        }));
    }
    log.push_str(&format!("\nStored facts ({}):\n", doc.facts.len()));
    log.push_str(&output::facts_table(&doc.facts));
    log.push_str("\nSearch \"乌龙茶 Rust\":\n");
    for h in &hits {
        log.push_str(&format!(
            "  [{}] {} ({})\n",
            h.fact.category,
            h.fact.content,
            h.match_type.as_str()
        ));
    }
    log.push_str("\nThe block a host injects before the next turn:\n");
    log.push_str(&block.block);
    if let Some(sha) = &block.content_sha256 {
        log.push_str(&format!("(sha256 {sha})\n"));
    }
    if let Some(p) = path {
        log.push_str(&format!("\nThe store was kept at {}\n", p.display()));
    }
    output::print_text(&log)
}
