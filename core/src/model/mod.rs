//! The values the engine and the stores exchange: keys, leases, persisted state and rows.
//!
//! Every type here is plain data with a stable camelCase JSON shape (the same shape as the
//! reference implementation), so a store may persist any of them as JSON text.

mod key;
mod rows;
mod state;
mod store_io;

pub use key::*;
pub use rows::*;
pub use state::*;
pub use store_io::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_replaces_top_level_fields_and_keeps_created_at() {
        let lanes = Lanes {
            backfill: Some(LaneCursor {
                cursor: Some("1".into()),
                ..LaneCursor::default()
            }),
            ..Lanes::default()
        };
        let first = StatePatch {
            lanes: Some(lanes),
            sequence: Some(3),
            updated_at: Some(10),
            ..StatePatch::default()
        };
        let state = PollerState::patched(None, &first);
        assert_eq!(state.created_at, 10);
        assert_eq!(state.sequence, 3);
        let second = StatePatch {
            lanes: Some(Lanes::default()),
            updated_at: Some(20),
            ..StatePatch::default()
        };
        let state = PollerState::patched(Some(state), &second);
        assert_eq!(state.lanes, Lanes::default());
        assert_eq!(
            (state.created_at, state.updated_at, state.sequence),
            (10, 20, 3)
        );
    }

    #[test]
    fn patch_without_updated_at_creates_at_zero() {
        let state = PollerState::patched(
            None,
            &StatePatch {
                paused: Some(true),
                ..StatePatch::default()
            },
        );
        assert_eq!(state.created_at, 0);
        assert!(state.paused);
    }

    #[test]
    fn patch_fields_name_the_set_fields() {
        let patch = StatePatch {
            paused: Some(true),
            sequence: Some(7),
            ..StatePatch::default()
        };
        let fields: Vec<(&str, String)> = patch
            .fields()
            .into_iter()
            .map(|(k, v)| (k, v.as_str().to_owned()))
            .collect();
        assert_eq!(
            fields,
            vec![("paused", "true".to_owned()), ("sequence", "7".to_owned())]
        );
    }
}
