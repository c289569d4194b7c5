//! Command-line arguments of `deermem` (clap derive). Global options are accepted before or
//! after the subcommand.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Exit codes, also printed by `--help`.
pub(crate) const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  failure (I/O, unexpected backend error; `migrate`: at least one user failed or was
     refused)
  2  bad arguments
  3  conflict: the memory changed concurrently (stale --expected-revision); nothing was changed
  4  not found: no such fact
  5  invalid input (empty content, confidence outside 0..1, bad user id, agent name or fact id)
  6  not supported by the configured memory backend
  7  stored memory is corrupted (manual repair needed; nothing was changed)
  8  backend unavailable or timed out: its server or database cannot be reached (also
     `context` and `search` when a remote read failed and the backend's fail-open policy
     answered with empty memory)
  9  `db migrate`: the database schema is newer than this build; nothing was changed";

/// The DeerMem long-term memory engine.
#[derive(Debug, Parser)]
#[command(name = "deermem", version, about = "DeerMem: long-term memory for LLM agents", after_help = EXIT_CODES_HELP)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Options every command accepts.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct GlobalArgs {
    /// Storage root directory (wins over the config's `storage_path`).
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) storage_path: Option<PathBuf>,
    /// A DeerFlow `config.yaml` (with a top-level `memory:`) or a bare `memory:` section.
    /// Defaults to `$DEERMEM_CONFIG` when set.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// More logging on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

/// `--mode` of `deermem search`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// Words only: BM25 (plus CJK bigrams).
    Bm25,
    /// Meaning only: nearest by embedding.
    Vector,
    /// Both rankings fused (reciprocal rank fusion; a decisive word match stays first).
    Hybrid,
}

impl From<ModeArg> for deermem_core::SearchMode {
    fn from(m: ModeArg) -> Self {
        match m {
            ModeArg::Bm25 => Self::Bm25,
            ModeArg::Vector => Self::Vector,
            ModeArg::Hybrid => Self::Hybrid,
        }
    }
}

/// Who a command acts for.
#[derive(Debug, Args, Clone)]
pub(crate) struct ScopeArgs {
    /// The raw user id, e.g. `bob@example.com`.
    #[arg(long, value_name = "USER", allow_hyphen_values = true)]
    pub(crate) user: String,
    /// The agent; omitted means the default bucket.
    #[arg(long, value_name = "AGENT", allow_hyphen_values = true)]
    pub(crate) agent: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Read and edit facts.
    #[command(subcommand)]
    Facts(FactsCommand),
    /// The user's summaries.
    #[command(subcommand)]
    Summaries(SummariesCommand),
    /// Print the memory document (the DeerMem JSON shape) on stdout.
    Export {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Replace a bucket with a memory document read from FILE (`-` for stdin; at most 2000
    /// facts).
    Import {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The document to import.
        file: PathBuf,
    },
    /// Ranked search within one user's bucket.
    Search {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The query (may start with `-`).
        #[arg(allow_hyphen_values = true)]
        query: String,
        /// How many hits.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
        /// Only this category.
        #[arg(long, allow_hyphen_values = true)]
        category: Option<String>,
        /// How to rank: words (`bm25`), meaning (`vector`) or both fused (`hybrid`); the
        /// vector modes need `embedding` configured. Default: the config's `search.mode`.
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
    },
    /// The derived search index.
    #[command(subcommand)]
    Index(IndexCommand),
    /// Migrate legacy data (Markdown facts from v1 JSON, the pre-isolation shared layout), or
    /// move every user between storages (`--from file:<root> --to postgres://…` and back).
    Migrate(MigrateArgs),
    /// The PostgreSQL database of `storage_class: postgres`.
    #[command(subcommand)]
    Db(DbCommand),
    /// The turn journal: accepted turns waiting for extraction, and dead-lettered ones.
    #[command(subcommand)]
    Turns(TurnsCommand),
    /// Run memory extraction on a conversation now (not after the debounce) and report what
    /// was added, removed and rejected. With a remote backend, send it now and report how many
    /// messages reached the server (a failed capture exits 8, or 1 when the server refused).
    Ingest {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The host thread id the conversation belongs to.
        #[arg(long, default_value = "cli", allow_hyphen_values = true)]
        thread: String,
        /// A JSON list of `{role, content}` messages or a DeerFlow/LangChain message dump
        /// (`-` for stdin).
        file: PathBuf,
    },
    /// Print the `<memory>` block a host would inject for this user and agent.
    Context {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// The main job on embedded defaults: a temporary store, a bundled conversation, the
    /// extracted facts, a search and the injection block.
    Demo {
        /// Keep the temporary store and print its path.
        #[arg(long)]
        keep: bool,
    },
    /// Serve the HTTP gateway (DeerFlow-compatible `/api/memory` routes).
    Serve {
        /// Address to listen on (overrides `gateway.bind`).
        #[arg(long, value_name = "ADDR")]
        bind: Option<std::net::SocketAddr>,
    },
    /// Serve the memory tools as an MCP server (stdio, or streamable HTTP with `--bind`).
    Mcp {
        /// The user every call acts for (stdio mode; one user per process). Without it the
        /// server acts as the user `default`, the id the reference uses when a host names no
        /// user.
        #[arg(long, value_name = "USER", allow_hyphen_values = true)]
        user: Option<String>,
        /// The agent bucket; omitted means the default bucket.
        #[arg(long, value_name = "AGENT")]
        agent: Option<String>,
        /// Serve streamable HTTP on this address; users come from bearer tokens
        /// (`gateway.auth.tokens`).
        #[arg(long, value_name = "ADDR")]
        bind: Option<std::net::SocketAddr>,
        /// With --bind: answer CORS preflights for this browser origin (scheme://host[:port],
        /// or `*` for any), so browser-based MCP clients can connect; repeatable. Requests still
        /// need a bearer token.
        #[arg(long, value_name = "ORIGIN", requires = "bind", value_parser = parse_origin)]
        allow_origin: Vec<String>,
    },
}

fn parse_origin(s: &str) -> Result<String, deermem_mcp::InvalidOrigin> {
    deermem_mcp::check_cors_origin(s).map(|()| s.to_owned())
}

#[derive(Debug, Subcommand)]
pub(crate) enum FactsCommand {
    /// List facts (sorted by id).
    List {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Show one fact.
    Get {
        /// Fact id.
        id: String,
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Add a fact.
    Add {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The fact text (may start with `-`, e.g. a Markdown list item).
        #[arg(long, allow_hyphen_values = true)]
        content: String,
        /// Category (default `context`).
        #[arg(long, default_value = "context", allow_hyphen_values = true)]
        category: String,
        /// Confidence between 0 and 1.
        #[arg(long, default_value_t = 0.5, allow_hyphen_values = true)]
        confidence: f64,
    },
    /// Change a fact; omitted fields are kept.
    Update {
        /// Fact id.
        id: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// New text (may start with `-`).
        #[arg(long, allow_hyphen_values = true)]
        content: Option<String>,
        /// New category.
        #[arg(long, allow_hyphen_values = true)]
        category: Option<String>,
        /// New confidence.
        #[arg(long, allow_hyphen_values = true)]
        confidence: Option<f64>,
        /// Fail with a conflict unless the fact is at this revision.
        #[arg(long)]
        expected_revision: Option<u64>,
    },
    /// Delete a fact.
    Delete {
        /// Fact id.
        id: String,
        #[command(flatten)]
        scope: ScopeArgs,
        /// Fail with a conflict unless the fact is at this revision.
        #[arg(long)]
        expected_revision: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum SummariesCommand {
    /// Show the user's summaries.
    Get {
        /// The raw user id.
        #[arg(long, value_name = "USER", allow_hyphen_values = true)]
        user: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum IndexCommand {
    /// Rebuild the index for everything, one user, or one user's agent.
    Rebuild {
        /// Only this user.
        #[arg(long)]
        user: Option<String>,
        /// Only this agent of the user (requires --user).
        #[arg(long, requires = "user")]
        agent: Option<String>,
    },
    /// Index configuration and health.
    Status,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TurnsCommand {
    /// List the turn journal's turns (pending and dead-lettered), oldest first; works beside a
    /// running server.
    List {
        /// Only this user's turns.
        #[arg(long, allow_hyphen_values = true)]
        user: Option<String>,
        /// Only dead-lettered turns.
        #[arg(long)]
        dead: bool,
        /// One JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Make dead-lettered turns pending again and run them now (stop the server first, or use
    /// its `POST /api/memory/turns/{id}/retry`).
    Retry {
        /// The turn ids.
        ids: Vec<String>,
        /// Every dead-lettered turn.
        #[arg(long)]
        all_dead: bool,
    },
    /// Remove turns from the journal for good (stop the server first, or use its
    /// `DELETE /api/memory/turns/{id}`).
    Drop {
        /// The turn ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum DbCommand {
    /// Apply this build's schema migrations and print the versions before and after (every
    /// `deermem serve` also applies them at start). Exits 9, changing nothing, when the
    /// database's schema is newer than this build.
    Migrate {
        /// Only show the database's schema version and this build's, changing nothing.
        #[arg(long)]
        status: bool,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").args(["all_users", "user_id", "user_isolation", "from"]).multiple(true).required(true)))]
pub(crate) struct MigrateArgs {
    /// Move every user to another storage: `file:<root>`, `postgres://…` (libpq `sslmode` and
    /// `sslrootcert` choose TLS), or `$VAR` naming one (the URL is never printed). With --to.
    #[arg(long, value_name = "FROM", requires = "to", conflicts_with_all = ["all_users", "user_id", "user_isolation", "dry_run"])]
    pub(crate) from: Option<String>,
    /// Where --from moves to (same forms).
    #[arg(long, value_name = "TO", requires = "from")]
    pub(crate) to: Option<String>,
    /// With --from: replace destination users that hold different memory (refused otherwise).
    #[arg(long, requires = "from")]
    pub(crate) overwrite: bool,
    /// With --from: the PostgreSQL schema on the database side(s) (default `deermem`).
    #[arg(long, value_name = "SCHEMA", requires = "from")]
    pub(crate) pg_schema: Option<String>,
    /// Migrate every user found under `users/`.
    #[arg(long, conflicts_with_all = ["user_id", "user_isolation"])]
    pub(crate) all_users: bool,
    /// Migrate these users (original ids, e.g. `bob@example.com`); repeatable.
    #[arg(long = "user-id", value_name = "ID", allow_hyphen_values = true)]
    pub(crate) user_id: Vec<String>,
    /// Move the pre-isolation shared layout (`memory.json`, `agents/`) into a user's bucket
    /// (`--user-id`, default `default`).
    #[arg(long)]
    pub(crate) user_isolation: bool,
    /// Report what would happen without writing anything.
    #[arg(long)]
    pub(crate) dry_run: bool,
}
