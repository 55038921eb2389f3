//! Constructors and [`CursorConfig`]: the cursor option a poller builder takes.

use std::fmt;
use std::sync::Arc;

use super::{
    CustomCursor, CustomStrategy, PageCursor, SharedStrategy, SnapshotDiffCursor,
    TimestampCursorBuilder, TokenCursor,
};
use crate::error::Result;

/// A `timestamp` strategy on `field` (a dot path); set the other options on the builder.
///
/// ```
/// use std::time::Duration;
/// use watukuy_core::cursor::{self, CursorConfig};
///
/// let config: CursorConfig = cursor::timestamp("updatedAt")
///     .tie_break("id")
///     .lag(Duration::from_secs(2))
///     .into();
/// assert_eq!(config.name(), "timestamp");
/// ```
pub fn timestamp(field: impl Into<String>) -> TimestampCursorBuilder {
    TimestampCursorBuilder::new(field)
}

/// A `token` strategy starting from `initial` (`None`: the API's first page).
pub fn token(initial: Option<String>) -> TokenCursor {
    TokenCursor::new(initial)
}

/// A `page` strategy starting at page `initial` (usually 1, the default; see
/// [`PageCursor::default`]).
pub fn page(initial: u32) -> PageCursor {
    PageCursor::new(initial)
}

/// The `snapshot_diff` strategy: a full listing every cycle, with delete detection.
pub fn snapshot_diff() -> SnapshotDiffCursor {
    SnapshotDiffCursor
}

/// A `custom` strategy over the user's [`CustomCursor`]: a Config error naming
/// `cursor.initial` when its initial cursor cannot be serialized (or read back).
pub fn custom<C: CustomCursor>(cursor: C) -> Result<CursorConfig> {
    CustomStrategy::new(cursor).map(|strategy| CursorConfig::strategy(Arc::new(strategy)))
}

/// The cursor option of a poller, built by [`timestamp`], [`token`], [`page`],
/// [`snapshot_diff`] or [`custom`] (each converts into it); its options are validated when the
/// poller is built (Config errors name them, e.g. `cursor.field`).
///
/// ```
/// use watukuy_core::cursor::{self, CursorConfig};
///
/// let options: Vec<CursorConfig> = vec![
///     cursor::timestamp("updatedAt").into(),
///     cursor::token(None).into(),
///     cursor::page(1).into(),
///     cursor::snapshot_diff().into(),
/// ];
/// let names: Vec<&str> = options.iter().map(CursorConfig::name).collect();
/// assert_eq!(names, ["timestamp", "token", "page", "snapshot_diff"]);
/// ```
#[derive(Clone)]
pub struct CursorConfig(Kind);

/// What a [`CursorConfig`] holds.
#[derive(Clone)]
enum Kind {
    /// `timestamp`, validated when built.
    Timestamp(TimestampCursorBuilder),
    Token(TokenCursor),
    Page(PageCursor),
    SnapshotDiff(SnapshotDiffCursor),
    /// An already built strategy (a custom cursor's).
    Strategy(SharedStrategy),
}

impl CursorConfig {
    /// The strategy's name (`timestamp`, `token`, `page`, `snapshot_diff`, `custom`, ...).
    pub fn name(&self) -> &'static str {
        match &self.0 {
            Kind::Timestamp(_) => "timestamp",
            Kind::Token(_) => "token",
            Kind::Page(_) => "page",
            Kind::SnapshotDiff(_) => "snapshot_diff",
            Kind::Strategy(strategy) => strategy.name(),
        }
    }

    /// An already built strategy (a custom cursor's).
    pub(crate) fn strategy(strategy: SharedStrategy) -> Self {
        CursorConfig(Kind::Strategy(strategy))
    }

    /// Validates the options (Config errors name them, e.g. `cursor.field`) and builds the
    /// strategy.
    pub(crate) fn into_strategy(self) -> Result<SharedStrategy> {
        match self.0 {
            Kind::Timestamp(builder) => builder.into_strategy(),
            Kind::Token(token) => Ok(token.into_strategy()),
            Kind::Page(page) => Ok(page.into_strategy()),
            Kind::SnapshotDiff(snapshot) => Ok(snapshot.into_strategy()),
            Kind::Strategy(strategy) => Ok(strategy),
        }
    }
}

impl fmt::Debug for CursorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Timestamp(builder) => f.debug_tuple("Timestamp").field(builder).finish(),
            Kind::Token(token) => f.debug_tuple("Token").field(token).finish(),
            Kind::Page(page) => f.debug_tuple("Page").field(page).finish(),
            Kind::SnapshotDiff(_) => f.write_str("SnapshotDiff"),
            Kind::Strategy(strategy) => f.debug_tuple("Strategy").field(&strategy.name()).finish(),
        }
    }
}

impl From<TimestampCursorBuilder> for CursorConfig {
    fn from(builder: TimestampCursorBuilder) -> Self {
        CursorConfig(Kind::Timestamp(builder))
    }
}

impl From<TokenCursor> for CursorConfig {
    fn from(cursor: TokenCursor) -> Self {
        CursorConfig(Kind::Token(cursor))
    }
}

impl From<PageCursor> for CursorConfig {
    fn from(cursor: PageCursor) -> Self {
        CursorConfig(Kind::Page(cursor))
    }
}

impl From<SnapshotDiffCursor> for CursorConfig {
    fn from(cursor: SnapshotDiffCursor) -> Self {
        CursorConfig(Kind::SnapshotDiff(cursor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::{Cursor, CustomAdvance, FnCustomCursor, TimestampCursor};
    use crate::error::ErrorCode;

    #[test]
    fn every_strategy_converts_and_builds() {
        let counter = FnCustomCursor::new(0_u32, |n: &u32, _step| {
            Ok(CustomAdvance {
                cursor: n + 1,
                done: true,
            })
        });
        let configs: Vec<CursorConfig> = vec![
            timestamp("updatedAt").into(),
            CursorConfig::strategy(Arc::new(TimestampCursor::new("updatedAt").unwrap())),
            token(Some("t".into())).into(),
            page(0).into(),
            snapshot_diff().into(),
            custom(counter).unwrap(),
        ];
        let expected = [
            (
                "timestamp",
                "Timestamp(",
                r#"{"value":null,"tieBreak":null}"#,
            ),
            (
                "timestamp",
                "Strategy(\"timestamp\")",
                r#"{"value":null,"tieBreak":null}"#,
            ),
            ("token", "Token(", r#"{"value":"t"}"#),
            ("page", "Page(", r#"{"page":0}"#),
            ("snapshot_diff", "SnapshotDiff", "null"),
            ("custom", "Strategy(\"custom\")", "0"),
        ];
        for (config, (name, debug, initial)) in configs.into_iter().zip(expected) {
            assert_eq!(config.name(), name);
            assert!(format!("{config:?}").starts_with(debug), "{config:?}");
            let strategy = config.into_strategy().unwrap();
            assert_eq!(strategy.name(), name);
            assert_eq!(strategy.serialize(&strategy.initial()), initial);
            let back = CursorConfig::strategy(strategy.clone())
                .into_strategy()
                .unwrap();
            assert_eq!(back.initial(), strategy.initial());
        }
    }

    #[test]
    fn invalid_timestamp_options_fail_when_built() {
        let err = CursorConfig::from(timestamp("a.").tie_break("id"))
            .into_strategy()
            .err()
            .unwrap();
        assert_eq!(err.code(), ErrorCode::Config);
        assert!(err.to_string().contains("`cursor.field`"), "{err}");
        assert_eq!(page(3).into_strategy().initial(), Cursor::Page { page: 3 });
    }
}
