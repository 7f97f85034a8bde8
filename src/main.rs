//! The `marshal` command line: one binary for simulation, evaluation, and (in later
//! issues) training, serving and the node agent.

mod cli;

use clap::Parser;

/// mimalloc rather than the system allocator: the gRPC service allocates per request,
/// and the load generator measured about 14 % less server CPU per job with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The status a shell reports for a process that SIGPIPE ended (128 + 13).
const CLOSED_PIPE_STATUS: i32 = 141;

/// `println!` panics when stdout is a closed pipe (`marshal list | head -1`); Rust ignores
/// SIGPIPE and the workspace forbids the `unsafe` that would restore it. Such a panic
/// stops the process quietly with the status SIGPIPE would have given; every other
/// panic goes to the default hook.
fn exit_quietly_on_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(CLOSED_PIPE_STATUS);
        }
        default_hook(info);
    }));
}

fn main() -> std::process::ExitCode {
    exit_quietly_on_closed_stdout();
    use std::io::IsTerminal as _;
    // Colour only on a terminal: journald and container logs would keep the escapes.
    tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", render(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `RUST_LOG`'s filter, or `warn`. A `RUST_LOG` that does not parse is said, not
/// silently replaced: an operator who asked for `debug` would otherwise wonder why the
/// logs stay quiet.
fn log_filter() -> tracing_subscriber::EnvFilter {
    match std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV) {
        Ok(value) => tracing_subscriber::EnvFilter::try_new(&value).unwrap_or_else(|e| {
            eprintln!(
                "warning: RUST_LOG={value:?} is not a log filter ({e}); logging warnings only"
            );
            "warn".into()
        }),
        Err(_) => "warn".into(),
    }
}

/// The error and its causes, `: `-separated like anyhow's `{:#}`, leaving out a cause whose
/// text the message already holds. Several library errors (telemetry I/O, Parquet and
/// NVML errors, the agent's, the learned policy's setup) both print their source and
/// return it from `source()`, so the plain chain said it twice ("… listing /x: not a
/// directory: not a directory").
fn render(error: &anyhow::Error) -> String {
    let mut out = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    /// An error that prints its source and returns it too.
    #[derive(Debug)]
    struct Repeats {
        path: &'static str,
        source: std::io::Error,
    }

    impl std::fmt::Display for Repeats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "reading {}: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Repeats {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_is_printed_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory");
        let repeated = anyhow::Error::new(Repeats {
            path: "/x",
            source: io(),
        })
        .context("inspecting /x");
        assert_eq!(
            render(&repeated),
            "inspecting /x: reading /x: not a directory"
        );
        // Causes that the message does not hold are all kept, in order.
        let chained = anyhow::Error::new(io())
            .context("opening the log")
            .context("starting the agent");
        assert_eq!(
            render(&chained),
            "starting the agent: opening the log: not a directory"
        );
    }
}
