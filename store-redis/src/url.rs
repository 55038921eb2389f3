//! The URLs [`RedisStore::connect`](crate::RedisStore::connect) accepts: what the driver takes
//! (`redis://`, `rediss://`, `unix://`), cluster URLs (`redis+cluster://h1:p1,h2:p2`,
//! `rediss+cluster://…`) and the TLS file parameters (`tls_ca_file`, `tls_cert_file`,
//! `tls_key_file`), which are read here and never reach the driver.

use watukuy_core::{Error, Result};

/// The option a bad URL is reported under.
const OPTION: &str = "redis.url";

/// A store URL, taken apart.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Driver URLs: the one server, or the cluster's seed nodes.
    pub(crate) nodes: Vec<String>,
    /// `redis+cluster://` or `rediss+cluster://`.
    pub(crate) cluster: bool,
    /// `rediss://` or `rediss+cluster://`.
    pub(crate) tls: bool,
    /// `tls_ca_file=<path>`.
    pub(crate) ca_file: Option<String>,
    /// `tls_cert_file=<path>`.
    pub(crate) cert_file: Option<String>,
    /// `tls_key_file=<path>`.
    pub(crate) key_file: Option<String>,
}

/// Takes `url` apart. Errors are `Config` errors naming `redis.url`, and never repeat the URL
/// (it may hold a password).
pub(crate) fn parse(url: &str) -> Result<Target> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::config(
            OPTION,
            "not a Redis URL: expected redis://, rediss://, unix://, redis+cluster:// or \
             rediss+cluster://",
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (rest, None),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let mut target = Target {
        nodes: Vec::new(),
        cluster: false,
        tls: false,
        ca_file: None,
        cert_file: None,
        key_file: None,
    };
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "tls_ca_file" => &mut target.ca_file,
            "tls_cert_file" => &mut target.cert_file,
            "tls_key_file" => &mut target.key_file,
            _ => {
                if !pair.is_empty() {
                    kept.push(pair);
                }
                continue;
            }
        };
        if value.is_empty() {
            return Err(Error::config(
                OPTION,
                format!("the URL parameter {name} names no file"),
            ));
        }
        *slot = Some(percent_decode(name, value)?);
    }
    let tail = {
        let mut tail = String::new();
        if !kept.is_empty() {
            tail.push('?');
            tail.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            tail.push('#');
            tail.push_str(fragment);
        }
        tail
    };
    match scheme.as_str() {
        "redis+cluster" | "rediss+cluster" => {
            target.cluster = true;
            target.tls = scheme == "rediss+cluster";
            let base = if target.tls { "rediss" } else { "redis" };
            let (authority, path) = match rest.find('/') {
                Some(at) => rest.split_at(at),
                None => (rest, ""),
            };
            if !matches!(path, "" | "/" | "/0") {
                return Err(Error::config(
                    OPTION,
                    "Redis Cluster has only database 0: leave the path of a cluster URL empty",
                ));
            }
            let (userinfo, hosts) = match authority.rsplit_once('@') {
                Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
                None => (String::new(), authority),
            };
            for host in hosts.split(',') {
                if host.trim().is_empty() {
                    return Err(Error::config(
                        OPTION,
                        "a cluster URL lists its seed nodes as host:port,host:port; one is empty",
                    ));
                }
                target
                    .nodes
                    .push(format!("{base}://{userinfo}{}/{tail}", host.trim()));
            }
        }
        _ => {
            target.tls = scheme == "rediss";
            target.nodes.push(format!("{scheme}://{rest}{tail}"));
        }
    }
    if !target.tls
        && (target.ca_file.is_some() || target.cert_file.is_some() || target.key_file.is_some())
    {
        return Err(Error::config(
            OPTION,
            "tls_ca_file, tls_cert_file and tls_key_file need a TLS URL (rediss:// or \
             rediss+cluster://)",
        ));
    }
    if target.cert_file.is_some() != target.key_file.is_some() {
        return Err(Error::config(
            OPTION,
            "tls_cert_file and tls_key_file go together (mutual TLS needs both)",
        ));
    }
    Ok(target)
}

/// `%XX` escapes of a URL parameter, decoded (a path may hold spaces or `&`).
fn percent_decode(name: &str, value: &str) -> Result<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    // `i < len` in the loop; the escape's digits are read with `get`.
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        Error::config(
                            OPTION,
                            format!("the URL parameter {name} has a bad % escape"),
                        )
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| Error::config(OPTION, format!("the URL parameter {name} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_urls_pass_through() {
        let t = parse(" redis://:pw@h:1/2?protocol=3 ").unwrap();
        assert_eq!(t.nodes, ["redis://:pw@h:1/2?protocol=3"]);
        assert!(!t.cluster && !t.tls);
        let t = parse("rediss://h:6380/0?tls_ca_file=/etc/ca%20x.pem#insecure").unwrap();
        assert_eq!(t.nodes, ["rediss://h:6380/0#insecure"]);
        assert!(t.tls);
        assert_eq!(t.ca_file.as_deref(), Some("/etc/ca x.pem"));
        let t = parse("unix:///tmp/redis.sock").unwrap();
        assert_eq!(t.nodes, ["unix:///tmp/redis.sock"]);
    }

    #[test]
    fn cluster_urls_list_their_seed_nodes() {
        let t = parse("redis+cluster://u:p@10.0.0.1:7000,10.0.0.2:7001").unwrap();
        assert!(t.cluster && !t.tls);
        assert_eq!(
            t.nodes,
            ["redis://u:p@10.0.0.1:7000/", "redis://u:p@10.0.0.2:7001/"]
        );
        let t = parse(
            "rediss+cluster://h:7000/?tls_ca_file=ca.pem&tls_cert_file=c.pem&tls_key_file=k.pem&protocol=3",
        )
        .unwrap();
        assert!(t.cluster && t.tls);
        assert_eq!(t.nodes, ["rediss://h:7000/?protocol=3"]);
        assert_eq!(
            (
                t.ca_file.as_deref(),
                t.cert_file.as_deref(),
                t.key_file.as_deref()
            ),
            (Some("ca.pem"), Some("c.pem"), Some("k.pem"))
        );
    }

    #[test]
    fn bad_urls_are_config_errors_without_the_password() {
        for bad in [
            "localhost:6379",
            "redis+cluster://:secret@h:1/3",
            "redis+cluster://:secret@h:1,,h:2",
            "redis://:secret@h?tls_ca_file=ca.pem",
            "rediss://:secret@h?tls_cert_file=c.pem",
            "rediss://:secret@h?tls_ca_file=",
            "rediss://:secret@h?tls_ca_file=%zz",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(
                matches!(&err, Error::Config { option, .. } if option == OPTION),
                "{bad}: {err}"
            );
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }

    proptest::proptest! {
        /// Whatever a URL holds, its password is in no error it gives.
        #[test]
        fn a_password_never_shows_in_an_error(
            scheme in "redis|rediss|redis\\+cluster|rediss\\+cluster|unix|REDIS|http",
            user in "[a-z]{0,4}",
            password in "[A-Z][A-Za-z0-9/?#@:%+ =&,]{5,12}",
            host in "[a-z0-9.,:]{0,16}",
            tail in "(/[0-9a-z]{0,3})?(\\?(tls_ca_file|tls_cert_file|tls_key_file|protocol)=[a-z%0-9./]{0,8})?",
        ) {
            let url = format!("{scheme}://{user}:{password}@{host}{tail}");
            if let Err(error) = parse(&url) {
                let printed = format!("{error} {error:?}");
                proptest::prop_assert!(!printed.contains(&password), "{url:?}: {printed}");
            }
        }
    }
}
