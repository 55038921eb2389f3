//! Which watukuy tests need something the Rust toolchain does not bring (a database, a broker,
//! a browser, a server program), and how `cargo test` reports them when it is missing.
//!
//! `BACKENDS` (in this crate's source) is the one list: each backend, what makes it available, and the reason libtest
//! prints for a test left out. A test that needs one says so with [`requires`]:
//!
//! ```text
//! #[watukuy_testenv::requires(postgres)]
//! #[tokio::test]
//! async fn two_instances_share_data() { .. }
//! ```
//!
//! The attribute is decided when the test is compiled. When the backend is available, or named
//! in `WATUKUY_REQUIRE_BACKENDS`, the test is left as it is: it runs, and a backend that turns
//! out to be missing fails it. Otherwise the test gets `#[ignore = "<reason>"]`, so libtest
//! counts it as *ignored* and prints the reason (`test two_instances_share_data ... ignored,
//! needs PostgreSQL: set WATUKUY_TEST_POSTGRES_URL ...`); it is never counted as passed. The
//! expansion reads every variable it depends on through `option_env!`, so cargo recompiles the
//! test target (only it) when one of them changes.
//!
//! `docs/testing.md` lists every test target that depends on each backend; a unit test of this
//! crate keeps that page, `.ci/run` and the uses of these macros in agreement.

use std::path::{Path, PathBuf};

use proc_macro::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

/// The variable naming backends that must never be left out (comma separated, `-` or `_`, any
/// case): a test needing one of them always runs, and fails when the backend is missing.
const REQUIRE_ENV: &str = "WATUKUY_REQUIRE_BACKENDS";

/// Something a test needs that the Rust toolchain does not bring.
struct Backend {
    /// Its name in `WATUKUY_REQUIRE_BACKENDS` and (with `_` for `-`) in [`requires`].
    name: &'static str,
    /// What makes it available.
    needs: Needs,
    /// Why a test needing it did not run, and how to make it run (libtest prints it).
    reason: &'static str,
}

/// What makes a backend available.
enum Needs {
    /// A non-empty environment variable (the service's URL); the test reads it when it runs.
    Url(&'static str),
    /// Programs, each found at its own variable when that is set, else on `PATH`, else in one
    /// of its usual folders.
    Programs(&'static [Program]),
}

/// A program a test starts.
struct Program {
    /// Its file name on `PATH`.
    name: &'static str,
    /// The variable naming its path instead.
    var: &'static str,
    /// Folders searched after `PATH`, where a distribution installs it off `PATH` (Debian's
    /// PostgreSQL server programs).
    dirs: &'static [&'static str],
}

impl Program {
    /// A program found at `var`, else on `PATH`.
    const fn on_path(name: &'static str, var: &'static str) -> Self {
        Self {
            name,
            var,
            dirs: &[],
        }
    }
}

/// Every backend, in the order `docs/testing.md` lists them.
const BACKENDS: &[Backend] = &[
    Backend {
        name: "postgres",
        needs: Needs::Url("WATUKUY_TEST_POSTGRES_URL"),
        reason: "needs PostgreSQL: set WATUKUY_TEST_POSTGRES_URL=postgres://user@host/database \
                 (docs/testing.md)",
    },
    Backend {
        name: "redis",
        needs: Needs::Url("WATUKUY_TEST_REDIS_URL"),
        reason: "needs Redis: set WATUKUY_TEST_REDIS_URL=redis://127.0.0.1:6379 \
                 (docs/testing.md)",
    },
    Backend {
        name: "mysql",
        needs: Needs::Url("WATUKUY_TEST_MYSQL_URL"),
        reason: "needs MySQL or MariaDB: set \
                 WATUKUY_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test (docs/testing.md)",
    },
    Backend {
        name: "nats",
        needs: Needs::Url("WATUKUY_TEST_NATS_URL"),
        reason: "needs NATS with JetStream: set WATUKUY_TEST_NATS_URL=nats://127.0.0.1:4222 \
                 (docs/testing.md)",
    },
    Backend {
        name: "rabbitmq",
        needs: Needs::Url("WATUKUY_TEST_AMQP_URL"),
        reason: "needs RabbitMQ: set WATUKUY_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f \
                 (docs/testing.md)",
    },
    Backend {
        name: "bullmq",
        needs: Needs::Programs(&[Program::on_path("node", "WATUKUY_TEST_NODE_BIN")]),
        reason: "needs Node.js (node on PATH, or WATUKUY_TEST_NODE_BIN) with BullMQ installed by \
                 `npm ci --prefix sinks/tests/node-bullmq` (docs/testing.md)",
    },
    Backend {
        name: "moto-server",
        needs: Needs::Programs(&[Program::on_path(
            "moto_server",
            "WATUKUY_TEST_MOTO_SERVER_BIN",
        )]),
        reason: "needs moto's SQS server: moto_server on PATH (pip install 'moto[server]') or \
                 WATUKUY_TEST_MOTO_SERVER_BIN, to start a private server (docs/testing.md)",
    },
    Backend {
        name: "kafka-server",
        needs: Needs::Programs(&[
            Program::on_path("tansu", "WATUKUY_TEST_TANSU_BIN"),
            Program::on_path("python3", "WATUKUY_TEST_PYTHON_BIN"),
        ]),
        reason: "needs the Kafka-compatible broker Tansu (cargo install --locked tansu --features \
                 dynostore; on PATH or at WATUKUY_TEST_TANSU_BIN) to start a private broker, and \
                 python3 with kafka-python (pip install kafka-python) to read it back \
                 (docs/testing.md)",
    },
    Backend {
        name: "browser",
        needs: Needs::Programs(&[
            Program::on_path("chromium", "WATUKUY_TEST_CHROMIUM"),
            Program::on_path("chromedriver", "WATUKUY_TEST_CHROMEDRIVER"),
        ]),
        reason: "needs a browser: chromium and chromedriver on PATH (Debian: apt-get install \
                 chromium chromium-driver) or WATUKUY_TEST_CHROMIUM and \
                 WATUKUY_TEST_CHROMEDRIVER (docs/testing.md)",
    },
    Backend {
        name: "redis-server",
        needs: Needs::Programs(&[Program::on_path(
            "redis-server",
            "WATUKUY_TEST_REDIS_SERVER_BIN",
        )]),
        reason: "needs the redis-server program on PATH (or WATUKUY_TEST_REDIS_SERVER_BIN) to \
                 start a private server (docs/testing.md)",
    },
    Backend {
        name: "nats-server",
        needs: Needs::Programs(&[Program::on_path(
            "nats-server",
            "WATUKUY_TEST_NATS_SERVER_BIN",
        )]),
        reason: "needs the nats-server program on PATH (or WATUKUY_TEST_NATS_SERVER_BIN) to \
                 start a private server (docs/testing.md)",
    },
    Backend {
        name: "postgres-server",
        needs: Needs::Programs(&[
            Program {
                name: "initdb",
                var: "WATUKUY_TEST_INITDB_BIN",
                dirs: POSTGRES_BIN_DIRS,
            },
            Program {
                name: "postgres",
                var: "WATUKUY_TEST_POSTGRES_SERVER_BIN",
                dirs: POSTGRES_BIN_DIRS,
            },
        ]),
        reason: "needs the PostgreSQL server programs initdb and postgres (Debian: apt-get install \
                 postgresql; found on PATH, in /usr/lib/postgresql/<version>/bin, or at \
                 WATUKUY_TEST_INITDB_BIN and WATUKUY_TEST_POSTGRES_SERVER_BIN) to start a \
                 private server (docs/testing.md)",
    },
    Backend {
        name: "pgbouncer",
        needs: Needs::Programs(&[Program {
            name: "pgbouncer",
            var: "WATUKUY_TEST_PGBOUNCER_BIN",
            dirs: &["/usr/sbin"],
        }]),
        reason: "needs the pgbouncer program (Debian: apt-get install pgbouncer; on PATH, in \
                 /usr/sbin, or at WATUKUY_TEST_PGBOUNCER_BIN) to start a private pooler \
                 (docs/testing.md)",
    },
];

/// Where Debian installs the PostgreSQL server programs (off `PATH`), newest first.
const POSTGRES_BIN_DIRS: &[&str] = &[
    "/usr/lib/postgresql/18/bin",
    "/usr/lib/postgresql/17/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/14/bin",
    "/usr/lib/postgresql/13/bin",
];

/// Marks a test that needs one or more backends (see the crate documentation): `#[requires(postgres)]`,
/// `#[requires(postgres, redis)]`. Put it above `#[test]` / `#[tokio::test]`.
///
/// When a backend is missing and `WATUKUY_REQUIRE_BACKENDS` does not name it, the test gets
/// `#[ignore = "<why, and how to run it>"]`. A trailing `or_cfg(<predicate>)` keeps the test
/// when the predicate holds (`or_cfg(feature = "testcontainers")`: the crate starts its own
/// server in Docker). Names are the backend names with `_` for `-` (`redis_server`).
///
/// The test itself must fail, never pass, when it runs without its backend (someone ran it with
/// `--include-ignored`, or required a backend that is not there).
#[proc_macro_attribute]
pub fn requires(args: TokenStream, item: TokenStream) -> TokenStream {
    match Request::parse(args) {
        Ok(request) => {
            let mut out = request.tracking();
            if let Some(reason) = request.reason() {
                out.extend(request.ignore_attribute(&reason));
            }
            out.extend(item);
            out
        }
        Err(error) => error.into_compile_error(),
    }
}

/// For a test with its own `main` (`harness = false`): why it is ignored, as an
/// `Option<&'static str>` decided like [`requires`] (same arguments). `None`: run it.
#[proc_macro]
pub fn ignored(args: TokenStream) -> TokenStream {
    match Request::parse(args) {
        Ok(request) => {
            let value: Result<TokenStream, _> = match (request.reason(), &request.or_cfg) {
                (None, _) => "::core::option::Option::<&'static str>::None".parse(),
                (Some(reason), None) => format!(
                    "::core::option::Option::<&'static str>::Some({})",
                    Literal::string(&reason)
                )
                .parse(),
                (Some(reason), Some(cfg)) => format!(
                    "if ::core::cfg!({cfg}) {{ ::core::option::Option::<&'static str>::None }} \
                     else {{ ::core::option::Option::<&'static str>::Some({}) }}",
                    Literal::string(&reason)
                )
                .parse(),
            };
            let mut body = request.tracking();
            body.extend(value.unwrap_or_default());
            braces(body)
        }
        Err(error) => braces(error.into_compile_error()),
    }
}

/// The path of a program a backend starts (`program!("chromium")`), as a
/// `Result<&'static str, &'static str>`: `Ok(path)` as found when the test was compiled (its
/// variable, else `PATH`), or `Err(why it was not found)` for the test to fail with.
#[proc_macro]
pub fn program(args: TokenStream) -> TokenStream {
    let tokens: Vec<TokenTree> = args.into_iter().collect();
    let name = match tokens.as_slice() {
        [TokenTree::Literal(literal)] => literal.to_string().trim_matches('"').to_owned(),
        _ => {
            return braces(
                MacroError::new(
                    Span::call_site(),
                    "expected a program name: program!(\"chromium\")",
                )
                .into_compile_error(),
            );
        }
    };
    let Some(program) = programs().find(|p| p.name == name) else {
        let known: Vec<&str> = programs().map(|p| p.name).collect();
        return braces(
            MacroError::new(
                tokens[0].span(),
                &format!("unknown program {name:?}; known: {}", known.join(", ")),
            )
            .into_compile_error(),
        );
    };
    let mut body = tracking(&[program.var, "PATH"]);
    let value = match find_program(program) {
        Ok(path) => format!(
            "::core::result::Result::<&'static str, &'static str>::Ok({})",
            Literal::string(&path.to_string_lossy())
        ),
        Err(why) => format!(
            "::core::result::Result::<&'static str, &'static str>::Err({})",
            Literal::string(&why)
        ),
    };
    body.extend(value.parse::<TokenStream>().unwrap_or_default());
    braces(body)
}

/// What a use of [`requires`] or [`ignored`] asks for.
struct Request {
    backends: Vec<&'static Backend>,
    /// A cfg predicate that keeps the test (as tokens, printed back).
    or_cfg: Option<String>,
}

impl Request {
    fn parse(args: TokenStream) -> Result<Self, MacroError> {
        let mut backends = Vec::new();
        let mut or_cfg = None;
        let mut tokens = args.into_iter().peekable();
        while let Some(token) = tokens.next() {
            let TokenTree::Ident(ident) = &token else {
                return Err(MacroError::new(
                    token.span(),
                    "expected a backend name, e.g. requires(postgres)",
                ));
            };
            let word = ident.to_string();
            if word == "or_cfg" {
                match tokens.next() {
                    Some(TokenTree::Group(group))
                        if group.delimiter() == Delimiter::Parenthesis =>
                    {
                        or_cfg = Some(group.stream().to_string());
                    }
                    _ => {
                        return Err(MacroError::new(
                            ident.span(),
                            "expected or_cfg(<predicate>), e.g. or_cfg(feature = \"testcontainers\")",
                        ));
                    }
                }
            } else {
                let name = normalize(&word);
                let backend = BACKENDS.iter().find(|b| b.name == name).ok_or_else(|| {
                    let known: Vec<String> =
                        BACKENDS.iter().map(|b| b.name.replace('-', "_")).collect();
                    MacroError::new(
                        ident.span(),
                        &format!("unknown backend `{word}`; known: {}", known.join(", ")),
                    )
                })?;
                backends.push(backend);
            }
            match tokens.next() {
                None => {}
                Some(TokenTree::Punct(p)) if p.as_char() == ',' => {}
                Some(other) => return Err(MacroError::new(other.span(), "expected `,`")),
            }
        }
        if backends.is_empty() {
            return Err(MacroError::new(
                Span::call_site(),
                "name at least one backend, e.g. requires(postgres)",
            ));
        }
        Ok(Self { backends, or_cfg })
    }

    /// Why the test must not run (the reasons of its missing backends), or `None`.
    fn reason(&self) -> Option<String> {
        let required = std::env::var(REQUIRE_ENV).unwrap_or_default();
        let reasons: Vec<&str> = self
            .backends
            .iter()
            .filter(|b| !is_required(&required, b.name) && !is_available(b))
            .map(|b| b.reason)
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// `#[ignore = ".."]`, or `#[cfg_attr(not(<or_cfg>), ignore = "..")]`.
    fn ignore_attribute(&self, reason: &str) -> TokenStream {
        let ignore = format!("ignore = {}", Literal::string(reason));
        let inner = match &self.or_cfg {
            None => ignore,
            Some(cfg) => format!("cfg_attr(not({cfg}), {ignore})"),
        };
        let mut out = TokenStream::from(TokenTree::Punct(Punct::new('#', Spacing::Alone)));
        out.extend([TokenTree::Group(Group::new(
            Delimiter::Bracket,
            inner.parse().unwrap_or_default(),
        ))]);
        out
    }

    /// A `const _` reading, through `option_env!`, every variable the decision depended on.
    fn tracking(&self) -> TokenStream {
        let mut vars = vec![REQUIRE_ENV];
        for backend in &self.backends {
            match &backend.needs {
                Needs::Url(var) => vars.push(var),
                Needs::Programs(programs) => {
                    vars.extend(programs.iter().map(|p| p.var));
                    vars.push("PATH");
                }
            }
        }
        tracking(&vars)
    }
}

/// `const _: () = { let _ = ::core::option_env!("VAR"); .. };`: rustc records each variable
/// in the dep-info file, so cargo recompiles the test target when one of them changes.
fn tracking(vars: &[&str]) -> TokenStream {
    let reads: String = vars
        .iter()
        .map(|var| format!("let _ = ::core::option_env!({});", Literal::string(var)))
        .collect();
    format!("const _: () = {{ {reads} }};")
        .parse()
        .unwrap_or_default()
}

fn braces(body: TokenStream) -> TokenStream {
    TokenTree::Group(Group::new(Delimiter::Brace, body)).into()
}

/// A backend name as compared: lower case, `_` read as `-`, no surrounding spaces.
fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// Whether the comma-separated `required` list names `backend`.
fn is_required(required: &str, backend: &str) -> bool {
    required.split(',').any(|name| normalize(name) == backend)
}

fn is_available(backend: &Backend) -> bool {
    match &backend.needs {
        Needs::Url(var) => std::env::var(var).is_ok_and(|url| !url.trim().is_empty()),
        Needs::Programs(programs) => programs.iter().all(|p| find_program(p).is_ok()),
    }
}

fn programs() -> impl Iterator<Item = &'static Program> {
    BACKENDS.iter().flat_map(|b| match &b.needs {
        Needs::Url(_) => [].iter(),
        Needs::Programs(programs) => programs.iter(),
    })
}

/// The program at its variable when that is set, else the first on `PATH`, else the first in
/// its usual folders.
fn find_program(program: &Program) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(program.var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(format!(
                "{}={} is not an executable file",
                program.var,
                path.display()
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(program.dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(program.name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| {
            let usual = if program.dirs.is_empty() {
                String::new()
            } else {
                format!(", nor in {}", program.dirs.join(", "))
            };
            format!(
                "{} is not on PATH{usual}, and {} is not set (docs/testing.md)",
                program.name, program.var
            )
        })
}

fn is_executable(path: &Path) -> bool {
    let Ok(metadata) = path.metadata() else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        metadata.is_file()
    }
}

/// A misuse of a macro, reported as a compile error where it happened.
struct MacroError {
    span: Span,
    message: String,
}

impl MacroError {
    fn new(span: Span, message: &str) -> Self {
        Self {
            span,
            message: message.to_owned(),
        }
    }

    /// `::core::compile_error!("..");` with the span of the offending token.
    fn into_compile_error(self) -> TokenStream {
        let mut message = Literal::string(&self.message);
        message.set_span(self.span);
        let tokens = [
            TokenTree::Punct(Punct::new(':', Spacing::Joint)),
            TokenTree::Punct(Punct::new(':', Spacing::Alone)),
            TokenTree::Ident(Ident::new("core", self.span)),
            TokenTree::Punct(Punct::new(':', Spacing::Joint)),
            TokenTree::Punct(Punct::new(':', Spacing::Alone)),
            TokenTree::Ident(Ident::new("compile_error", self.span)),
            TokenTree::Punct(Punct::new('!', Spacing::Alone)),
            TokenTree::Group(Group::new(
                Delimiter::Parenthesis,
                TokenTree::Literal(message).into(),
            )),
            TokenTree::Punct(Punct::new(';', Spacing::Alone)),
        ];
        tokens.into_iter().collect()
    }
}

#[cfg(test)]
mod tests;
