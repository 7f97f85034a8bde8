//! `marshal serve`: the online scheduler (gRPC primary mode and advisor).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use marshal_scheduler::service::{self, ServiceConfig, model_slot, tokio};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (TOML; see the README). Without it every default applies.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Overrides `listen` (port 0 picks a free port; the bound address is printed).
    #[arg(long)]
    pub listen: Option<String>,
    /// Overrides `db`.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Overrides `cluster` (a preset name or a cluster file).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Overrides `policy`.
    #[arg(long)]
    pub policy: Option<String>,
    /// Overrides `metrics_listen`.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Overrides `model` (the learned policy's artifact directory).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Overrides `decision_log_dir`.
    #[arg(long)]
    pub decision_log_dir: Option<PathBuf>,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            ServiceConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => ServiceConfig::default(),
    };
    if let Some(v) = args.listen {
        config.listen = v;
    }
    if let Some(v) = args.db {
        config.db = v;
    }
    if let Some(v) = args.cluster {
        config.cluster = v;
    }
    if let Some(v) = args.policy {
        config.policy = v;
    }
    if let Some(v) = args.metrics_listen {
        config.metrics_listen = Some(v);
    }
    if let Some(v) = args.model {
        config.model = Some(v);
    }
    if let Some(v) = args.decision_log_dir {
        config.decision_log_dir = Some(v);
    }
    config.validate()?;
    // The same default artifact as `marshal sim --policy learned`.
    let model_dir = config
        .model
        .clone()
        .unwrap_or_else(crate::cli::policy::default_model_dir);
    let model = model_slot(&config, &model_dir);
    if config.policy == marshal_scheduler::policies::learned::LEARNED {
        let status = model.status(&config.policy);
        if !status.loaded {
            eprintln!("warning: {}", status.detail);
        }
    }
    let spec = marshal_datasets::load_cluster(&config.cluster)
        .with_context(|| format!("loading cluster {}", config.cluster))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let handle = service::start(config, spec, model).await?;
        // Tests and scripts read the bound address from this line.
        println!("marshal serve: listening on {}", handle.addr);
        if let Some(m) = handle.metrics_addr {
            println!("marshal serve: metrics on http://{m}/metrics");
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("marshal serve: shutting down");
        handle.shutdown().await?;
        anyhow::Ok(())
    })
}
