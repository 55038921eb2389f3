//! TLS settings of [`PostgresStore::connect`](crate::PostgresStore::connect): the `sslmode` of
//! the URL, the root certificate (`sslrootcert` or [`PostgresOptions::ssl_root_cert`]), checked
//! before any connection is made so that a wrong setting is a `Config` error naming it.

use std::borrow::Cow;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use watukuy_core::{Error, Result};

use crate::options::{PostgresOptions, RootCert};

/// Applies the TLS settings of `url` and `options` to `connect` (parsed from `url`).
///
/// - `sslmode=require|verify-ca|verify-full` without the `tls` feature is a `Config` error;
/// - the root certificate is read here (a file once) and handed to the driver as PEM, after
///   checking it holds at least one certificate;
/// - a root certificate with `sslmode=require` verifies the chain (`verify-ca`), as libpq does;
///   with `disable`, `allow` or `prefer` it would verify nothing, which is a `Config` error.
pub(crate) fn configure(
    mut connect: PgConnectOptions,
    url: &str,
    options: &PostgresOptions,
) -> Result<PgConnectOptions> {
    let mode = connect.get_ssl_mode();
    let wants_tls = matches!(
        mode,
        PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull
    );
    if wants_tls && !cfg!(feature = "tls") {
        return Err(Error::config(
            "postgres.url",
            format!(
                "sslmode={} needs TLS, which this build of watukuy-store-postgres leaves out: \
                 enable its `tls` feature",
                mode_name(mode)
            ),
        ));
    }
    let (option, root) = match &options.ssl_root_cert {
        Some(root) => ("postgres.ssl_root_cert", Some(root.clone())),
        None => (
            "postgres.url",
            query_param(url, "sslrootcert").map(|value| {
                if value.trim_start().starts_with("-----BEGIN") {
                    RootCert::Pem(value.into_owned().into_bytes())
                } else {
                    RootCert::File(value.into_owned().into())
                }
            }),
        ),
    };
    let Some(root) = root else {
        return Ok(connect);
    };
    let (what, pem) = match root {
        RootCert::File(path) => {
            let pem = std::fs::read(&path).map_err(|e| {
                Error::config(
                    option,
                    format!("cannot read the root certificate {}: {e}", path.display()),
                )
            })?;
            (format!("the root certificate {}", path.display()), pem)
        }
        RootCert::Pem(pem) => ("the root certificate PEM".to_owned(), pem),
    };
    check_pem(option, &what, &pem)?;
    match mode {
        PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => {
            return Err(Error::config(
                option,
                format!(
                    "a root certificate is given but sslmode={} verifies no certificate: put \
                     sslmode=verify-full (or verify-ca) in the URL",
                    mode_name(mode)
                ),
            ));
        }
        PgSslMode::Require => connect = connect.ssl_mode(PgSslMode::VerifyCa),
        PgSslMode::VerifyCa | PgSslMode::VerifyFull => {}
    }
    Ok(connect.ssl_root_cert_from_pem(pem))
}

/// `sslmode` as written in a URL.
fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// The percent-decoded value of the query parameter `name` of a URL (the last one wins, as in
/// the driver).
fn query_param<'a>(url: &'a str, name: &str) -> Option<Cow<'a, str>> {
    let query = url.split_once('?')?.1;
    let query = query.split_once('#').map_or(query, |(query, _)| query);
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| *key == name)
        .map(|(_, value)| percent_decode(value))
        .next_back()
}

/// `%XX` escapes and `+` (a space, in a query) decoded; invalid escapes are kept as written.
fn percent_decode(value: &str) -> Cow<'_, str> {
    if !value.contains(['%', '+']) {
        return Cow::Borrowed(value);
    }
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    // `i < len` in the loop, and `i + 1 <= (i + 3).min(len)`: neither index can fail.
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let hex = std::str::from_utf8(&bytes[i + 1..(i + 3).min(bytes.len())])
                    .ok()
                    .filter(|hex| hex.len() == 2)
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                match hex {
                    Some(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// At least one certificate, every PEM certificate block readable.
#[cfg(feature = "tls")]
fn check_pem(option: &str, what: &str, pem: &[u8]) -> Result<()> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| Error::config(option, format!("{what} is not valid PEM: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(Error::config(
            option,
            format!("{what} holds no certificate (expected -----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(())
}

#[cfg(not(feature = "tls"))]
fn check_pem(option: &str, what: &str, _pem: &[u8]) -> Result<()> {
    Err(Error::config(
        option,
        format!(
            "{what} is given, but TLS is not compiled in: enable the `tls` feature of \
             watukuy-store-postgres"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_found_and_decoded() {
        let url = "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem#frag";
        assert_eq!(
            query_param(url, "sslrootcert").as_deref(),
            Some("/etc/ca x.pem")
        );
        assert_eq!(query_param(url, "sslmode").as_deref(), Some("verify-full"));
        assert_eq!(query_param(url, "missing"), None);
        assert_eq!(query_param("postgres://u@h/db", "sslrootcert"), None);
        assert_eq!(
            query_param("postgres://h/d?a=1&a=2", "a").as_deref(),
            Some("2")
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41+b"), "%zzA b");
    }
}
