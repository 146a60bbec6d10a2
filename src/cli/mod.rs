//! The subcommands of the `sked` binary that are not the server, the worker or `sked dev`
//! (those are in the library, [`sked::app`]): database administration and the REST API
//! client's commands, one module per group of subcommands. The modules depend on [`args`]
//! and [`format`] and on no other subcommand's module but the task commands', which submit
//! workflows and services too.

/// `print!` to stdout for the commands' answers: when the reader has gone (`sked list |
/// head`), the command ends quietly with status 0, as a pipeline expects; any other failure
/// to write ends it with status 1 and says why. (`print!` panics on a closed pipe.)
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($arg)*) {
            crate::cli::stdout_failed(e);
        }
    }};
}

/// [`out!`] with a newline.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            crate::cli::stdout_failed(e);
        }
    }};
}

/// Ends the process after a failed write to stdout: quietly when the reader has gone.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1);
}

pub mod alerts;
pub mod args;
pub mod bulk;
pub mod commands;
pub mod format;
pub mod queues;
pub mod schedules;
pub mod search_index;
pub mod services;
pub mod spawn;
pub mod units;
pub mod wait;
pub mod when;
pub mod workflows;
