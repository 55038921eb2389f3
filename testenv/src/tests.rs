//! The list of backends, `docs/testing.md`, `.ci/run` and the tests that use the macros agree.

use std::path::{Path, PathBuf};

use super::{BACKENDS, Needs, is_required, normalize};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `.rs` file of the workspace outside `target/`, hidden folders and this crate.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "testenv") {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The backends a file names in `requires(..)` and `ignored!(..)`, in code (comments aside).
fn uses(text: &str) -> Vec<String> {
    let text: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .flat_map(|line| [line, "\n"])
        .collect();
    let mut names = Vec::new();
    for marker in ["::requires(", "#[requires(", "ignored!("] {
        for (at, _) in text.match_indices(marker) {
            let args = text[at + marker.len()..].split(')').next().unwrap_or("");
            for arg in args.split(',') {
                let arg = arg.trim();
                // Names are identifiers; `or_cfg(..)` and prose (`requires(postgres, ..)`) end
                // the list.
                if arg.is_empty()
                    || arg.starts_with("or_cfg")
                    || !arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    break;
                }
                names.push(normalize(arg));
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The text of `### \`name\`` up to the next heading of that level or above.
fn section<'a>(doc: &'a str, name: &str) -> &'a str {
    let heading = format!("### `{name}`");
    let start = doc
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/testing.md has no section {heading}"));
    let rest = &doc[start + heading.len()..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min();
    &rest[..end.unwrap_or(rest.len())]
}

#[test]
fn names_compare_in_any_case_with_dashes_or_underscores() {
    assert_eq!(normalize(" Redis_Server "), "redis-server");
    assert!(is_required("postgres, REDIS ,nats_server", "redis"));
    assert!(is_required("postgres, REDIS ,nats_server", "nats-server"));
    assert!(!is_required("postgres", "redis"));
    assert!(!is_required("", "postgres"));
    for backend in BACKENDS {
        assert_eq!(normalize(backend.name), backend.name, "a canonical name");
        assert!(
            backend.reason.starts_with("needs ") && backend.reason.contains("docs/testing.md"),
            "{}: {}",
            backend.name,
            backend.reason
        );
    }
}

/// `docs/testing.md` describes every backend with its variables, and names every test file
/// that depends on one in that backend's section: it is the complete list of what "all tests"
/// means.
#[test]
fn docs_list_every_backend_and_every_test_that_needs_one() {
    let root = workspace();
    let doc = read(&root.join("docs/testing.md"));
    for backend in BACKENDS {
        let text = section(&doc, backend.name);
        let words: Vec<&str> = match &backend.needs {
            Needs::Url(var) => vec![var],
            Needs::Programs(programs) => programs.iter().flat_map(|p| [p.name, p.var]).collect(),
        };
        for word in words {
            assert!(
                text.contains(word),
                "docs/testing.md, section `{}`: does not mention {word}",
                backend.name
            );
        }
    }
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut seen = 0;
    for file in files {
        let text = read(&file);
        let relative = file
            .strip_prefix(&root)
            .expect("inside the workspace")
            .to_string_lossy()
            .replace('\\', "/");
        for name in uses(&text) {
            assert!(
                BACKENDS.iter().any(|b| b.name == name),
                "{relative}: unknown backend {name}"
            );
            assert!(
                section(&doc, &name).contains(&format!("`{relative}`")),
                "{relative} needs {name}: list it in docs/testing.md, section `{name}`"
            );
            seen += 1;
        }
    }
    assert!(
        seen > 10,
        "found only {seen} uses of the macros: is the scan broken?"
    );
}

/// CI requires every backend, so nothing is left out there.
#[test]
fn ci_requires_every_backend() {
    let ci = read(&workspace().join(".ci/run"));
    let line = ci
        .lines()
        .find(|l| l.contains("export WATUKUY_REQUIRE_BACKENDS="))
        .expect(".ci/run exports WATUKUY_REQUIRE_BACKENDS");
    let list = line
        .split_once('=')
        .map(|(_, v)| v.trim_matches(['"', '\'']))
        .unwrap_or("");
    for backend in BACKENDS {
        assert!(
            is_required(list, backend.name),
            ".ci/run does not require {}: {line}",
            backend.name
        );
    }
}

#[test]
fn uses_are_read_from_attributes_and_macro_calls() {
    let text = "#[watukuy_testenv::requires(postgres, redis_server, or_cfg(feature = \"x\"))]\n\
                let why = watukuy_testenv::ignored!(redis);\n\
                // prose that requires(nothing), or #[requires(nats)]";
    assert_eq!(uses(text), ["postgres", "redis", "redis-server"]);
}
