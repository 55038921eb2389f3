//! The `watukuy` binary: a thin shell around [`watukuy_cli::main_with`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = watukuy_cli::main_with(
        std::env::args_os(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    ExitCode::from(code)
}
