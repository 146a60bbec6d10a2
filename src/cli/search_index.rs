//! `sked search-index`: the text filter's trigram index (`docs/api.md`, "Listing tasks").
//! Database administration, like `sked migrate`: it runs with the account that migrates.

use anyhow::Context;
use clap::Subcommand;
use sked::app::DatabaseArgs;
use sked_db::listing::TextIndex;

#[derive(Debug, Subcommand)]
pub enum SearchIndexCommand {
    /// Say whether the index is there, and its size.
    Status(DatabaseArgs),
    /// Make the index (CREATE INDEX CONCURRENTLY, after the pg_trgm extension): a text search
    /// finds rare texts at once, and every task inserted costs about twice as much.
    Enable(DatabaseArgs),
    /// Drop the index: a text search walks the tasks again, at most 10,000 per request.
    Disable(DatabaseArgs),
}

pub async fn run(cmd: SearchIndexCommand) -> anyhow::Result<()> {
    let (SearchIndexCommand::Status(args)
    | SearchIndexCommand::Enable(args)
    | SearchIndexCommand::Disable(args)) = &cmd;
    args.pooling.configure(false)?;
    // CREATE INDEX CONCURRENTLY runs outside a transaction, in a session of its own.
    let pool = sked_db::connect_session(
        &args.database_url,
        "sked-search-index",
        1,
        "sked search-index",
    )
    .await
    .context("connecting to the database")?;
    sked_db::check_schema(&pool).await?;
    let state = match cmd {
        SearchIndexCommand::Status(_) => sked_db::listing::text_index(&pool).await?,
        SearchIndexCommand::Enable(_) => sked_db::listing::text_index_enable(&pool)
            .await
            .context("making the trigram index (it needs the pg_trgm extension, which ships with PostgreSQL, and the rights of the account that migrates)")?,
        SearchIndexCommand::Disable(_) => {
            sked_db::listing::text_index_disable(&pool).await?;
            sked_db::listing::text_index(&pool).await?
        }
    };
    pool.close().await;
    match state {
        TextIndex::Missing => outln!("search index: off (text searches walk the tasks)"),
        TextIndex::NotReady => {
            outln!(
                "search index: not ready (being built, or a failed build: run `sked search-index enable` again)"
            )
        }
        TextIndex::Ready { bytes } => outln!(
            "search index: on ({:.1} MiB)",
            bytes as f64 / (1024.0 * 1024.0)
        ),
    }
    Ok(())
}
