//! A password in a store URL never appears in anything the command line prints: not in an
//! error for a URL it refuses, nor in the URL's `Display` or `Debug`, whatever the password
//! holds (`/`, `?`, `#`, `@`, `:`, spaces, non-ASCII) and whatever the scheme.

use proptest::prelude::*;
use watukuy_cli::StoreUrl;

proptest! {
    #[test]
    fn a_password_is_never_printed(
        scheme in prop_oneof![
            Just("postgres"), Just("postgresql"), Just("mysql"), Just("redis"), Just("rediss"),
            Just("redis+cluster"), Just("mongodb"), Just("http"), Just("POSTGRES"),
        ],
        user in "[a-z]{0,6}",
        password in "[A-Z][A-Za-z0-9/?#@:%+ \u{e9}\u{1F600}]{5,16}",
        host in "[a-z]{1,8}(:[0-9]{1,5})?",
        tail in "(/[a-z]{0,6})?(\\?[a-z]{1,4}=[a-z0-9]{0,6})?",
    ) {
        let url = format!("{scheme}://{user}:{password}@{host}{tail}");
        let printed = match StoreUrl::parse(&url) {
            Ok(parsed) => format!("{parsed} {parsed:?}"),
            Err(error) => format!("{error} {error:?} {}", error.message),
        };
        prop_assert!(!printed.contains(&password), "{url:?} printed as {printed:?}");
    }
}
