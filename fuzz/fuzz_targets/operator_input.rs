//! What an operator types: a command line as `watukuy` parses it, a store URL, a `replay` time,
//! a duration and the cursor JSON of `reset-cursor`. None of them panics; a password in the store
//! URL appears in nothing printed (the URL's `Display` and `Debug`, an error, the parsed command
//! line's `Debug`); a time is read or refused naming its option; a cursor is stored as written
//! or refused naming `--to`.
//!
//! The input is lines: the store URL, a time, a duration, the cursor for `--to`, the key's cursor
//! before it (empty: none), then the rest of a command line, one argument a line.
//!
//! A password is the URL's text between the `:` after the user and the last `@` (a `sqlite:`
//! URL, a file's path, has none). It counts as printed only when it shows in what is printed for
//! the URL and not in what is printed for the same URL with another password of the same length
//! (so a password that is also the host's name is not a finding).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use watukuy_cli::args::parse_duration;
use watukuy_cli::{Session, StoreUrl, parse_args, parse_time};
use watukuy_core::store::{PKey, Store};
use watukuy_fuzz::block_on;
use watukuy_store_memory::MemoryStore;

/// Everything the command line may print about `url`: the parsed URL or the error, and the
/// parsed command line naming it as its store.
fn printed(url: &str, rest: &[&str]) -> String {
    let mut out = match StoreUrl::parse(url) {
        Ok(parsed) => format!("{parsed}\n{parsed:?}"),
        Err(error) => format!("{error}\n{error:?}"),
    };
    let argv = ["watukuy", "--store", url]
        .into_iter()
        .chain(rest.iter().copied());
    match parse_args(argv) {
        Ok(cli) => out.push_str(&format!("\n{cli:?}")),
        Err(error) => out.push_str(&format!("\n{error}\n{error:?}")),
    }
    out
}

/// The password of `url` and the same URL with `x`s in its place. A `sqlite:` URL is a file's
/// path, printed as it is: it has no password.
fn password_of(url: &str) -> Option<(&str, String)> {
    if url.trim().starts_with("sqlite:") {
        return None;
    }
    let (scheme, rest) = url.split_once("://")?;
    let at = rest.rfind('@')?;
    let (user, password) = rest[..at].split_once(':')?;
    if password.is_empty() {
        return None;
    }
    let other = "x".repeat(password.chars().count());
    Some((
        password,
        format!("{scheme}://{user}:{other}{}", &rest[at..]),
    ))
}

fn check_url(url: &str, rest: &[&str]) {
    let shown = printed(url, rest);
    if let Some((password, other)) = password_of(url)
        && shown.contains(password)
    {
        assert!(
            printed(&other, rest).contains(password),
            "the password {password:?} of {url:?} is printed:\n{shown}"
        );
    }
}

fn check_time(text: &str) {
    if let Err(error) = parse_time("--from", text) {
        assert!(error.message.contains("--from"), "{error:?} for {text:?}");
    }
    let _ = parse_duration(text);
}

fn check_cursor(to: &str, current: &str) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let session = Session::new(Arc::clone(&store), "memory");
    let key = PKey::new("orders", "");
    block_on(async {
        if !current.is_empty()
            && session
                .reset_cursor(&key, Some(current), false)
                .await
                .is_err()
        {
            return;
        }
        match session.reset_cursor(&key, Some(to), false).await {
            Ok(()) => {
                let state = store
                    .load_state(&key)
                    .await
                    .expect("memory")
                    .expect("saved");
                let live = state.lanes.live.and_then(|lane| lane.cursor);
                assert_eq!(
                    live.as_deref(),
                    Some(to.trim()),
                    "--to {to:?} after {current:?}"
                );
            }
            Err(error) => assert!(error.message.contains("--to"), "{error:?} for {to:?}"),
        }
    });
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.split('\n');
    let url = lines.next().unwrap_or_default();
    let time = lines.next().unwrap_or_default();
    let duration = lines.next().unwrap_or_default();
    let to = lines.next().unwrap_or_default();
    let current = lines.next().unwrap_or_default();
    let rest: Vec<&str> = lines.collect();
    check_url(url, &rest);
    check_time(time);
    check_time(duration);
    check_cursor(to, current);
});
