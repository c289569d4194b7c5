//! The `deermem` command-line tool: data commands over any configured memory backend, index and
//! migration tools for the embedded storage, the PostgreSQL schema (`db migrate`). Run `deermem --help` for the commands and the
//! exit codes.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod cmd;
mod ctx;
mod db;
mod demo;
mod error;
mod logging;
mod output;
mod serve;
mod transfer;
mod turns;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command, SummariesCommand};
use crate::ctx::Ctx;
use crate::error::CliError;

async fn run(cli: Cli) -> Result<u8, CliError> {
    let ctx = Ctx::load(cli.global)?;
    let done = match cli.command {
        Command::Migrate(a) => return cmd::migrate(&ctx, a).await,
        Command::Facts(c) => cmd::facts(&ctx, c).await,
        Command::Summaries(SummariesCommand::Get { user }) => cmd::summaries(&ctx, &user).await,
        Command::Export { scope } => cmd::export(&ctx, &scope).await,
        Command::Import { scope, file } => cmd::import(&ctx, &scope, &file).await,
        Command::Search {
            scope,
            query,
            top_k,
            category,
            mode,
        } => cmd::search(&ctx, &scope, query, top_k, category, mode.map(Into::into)).await,
        Command::Index(c) => cmd::index(&ctx, c).await,
        Command::Db(c) => db::run(&ctx, c).await,
        Command::Turns(c) => turns::run(&ctx, c).await,
        Command::Ingest {
            scope,
            thread,
            file,
        } => cmd::ingest(&ctx, &scope, thread, &file).await,
        Command::Context { scope } => cmd::context(&ctx, &scope).await,
        Command::Demo { keep } => demo::run(&ctx, keep).await,
        Command::Serve { bind } => serve::serve(&ctx, bind).await,
        Command::Mcp {
            user,
            agent,
            bind,
            allow_origin,
        } => serve::mcp(&ctx, user, agent, bind, allow_origin).await,
    };
    done.map(|()| 0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let reports_failed_reads = matches!(
        cli.command,
        Command::Context { .. } | Command::Search { .. }
    );
    logging::init(cli.global.verbose, reports_failed_reads);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("deermem: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("deermem: {e}");
            e.exit_code()
        }
    }
}
