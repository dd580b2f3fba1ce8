//! `lattice download`: fetch a model from the Hugging Face hub into the shared cache
//! (`$HF_HOME/hub`), printing the snapshot folder on stdout. Progress goes to stderr.

use anyhow::Context;
use lattice_hub::{HubConfig, RepoRef};

/// Arguments of `lattice download`.
#[derive(clap::Args)]
pub struct Args {
    /// Hub model id, `ORG/NAME` (optionally `@REVISION`).
    id: String,
    /// Branch, tag or commit to fetch (default `main`, or the id's `@REVISION`).
    #[arg(long)]
    revision: Option<String>,
    /// Fetch only the repo files matching this glob (repeatable), e.g. `*Q4_K_M.gguf`.
    /// Default: the files the model needs (config, weights, tokenizer, sentence-transformers
    /// files).
    #[arg(long)]
    include: Vec<String>,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut repo = RepoRef::parse(&args.id)
        .with_context(|| format!("`{}` is not a hub model id (ORG/NAME)", args.id))?;
    if let Some(rev) = args.revision {
        repo.revision = rev;
    }
    let config = HubConfig::from_env();
    let snapshot = lattice_hub::download(&config, &repo, &args.include)
        .with_context(|| format!("cannot download `{}`", repo.repo_id))?;
    eprintln!(
        "{}@{}: {} files, {} bytes downloaded, commit {}",
        snapshot.repo_id,
        repo.revision,
        snapshot.files.len(),
        snapshot.downloaded_bytes,
        snapshot.commit
    );
    println!("{}", snapshot.dir.display());
    Ok(())
}
