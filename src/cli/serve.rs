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
    /// Sets `accept_inventory_change`: start even though the cluster no longer has a
    /// node an unfinished job is placed on (it is requeued) or the GPU models a waiting
    /// job allows (it is rejected). Without it such a start is refused, naming the jobs.
    #[arg(long)]
    pub accept_inventory_change: bool,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => ServiceConfig::from_file(path)?,
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
    config.accept_inventory_change |= args.accept_inventory_change;
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
        shut_down_on_signal("marshal serve", handle.shutdown()).await
    })
}

/// Waits for SIGINT or SIGTERM, then runs `shutdown`. A second signal while it runs
/// exits at once, with the shell's status for it (130 for SIGINT, 143 for SIGTERM): a
/// shutdown waiting on a hung `fsync` (a dead disk or NFS mount) would otherwise end
/// only with SIGKILL.
pub(crate) async fn shut_down_on_signal<E>(
    name: &str,
    shutdown: impl std::future::Future<Output = Result<(), E>>,
) -> anyhow::Result<()>
where
    anyhow::Error: From<E>,
{
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("{name}: shutting down (a second Ctrl-C or SIGTERM exits at once)");
    let second = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => SIGINT_STATUS,
            _ = term.recv() => SIGTERM_STATUS,
        }
    };
    match unless_first(shutdown, second).await {
        Ok(done) => Ok(done?),
        Err(status) => {
            eprintln!("{name}: second signal: exiting before the shutdown finished");
            std::process::exit(status)
        }
    }
}

/// Exit statuses for a process ended by SIGINT (2) and SIGTERM (15): 128 + the signal.
const SIGINT_STATUS: i32 = 130;
const SIGTERM_STATUS: i32 = 143;

/// `work`'s output, or `interrupt`'s when it completes first.
async fn unless_first<T, I>(
    work: impl std::future::Future<Output = T>,
    interrupt: impl std::future::Future<Output = I>,
) -> Result<T, I> {
    tokio::select! {
        biased;
        stop = interrupt => Err(stop),
        done = work => Ok(done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signal_wins_over_a_shutdown_that_hangs() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let hung = std::future::pending::<()>();
            let signalled = async {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                SIGTERM_STATUS
            };
            assert_eq!(unless_first(hung, signalled).await, Err(143));
            let finished = async { 7 };
            let never = std::future::pending::<i32>();
            assert_eq!(unless_first(finished, never).await, Ok(7));
        });
    }
}
