-- claim: an id with a marker came back as a new change (see watukuy_core::delivery::reapplies):
-- its marker is stamped again (so pruning measures its age from now); record_subject.sql then
-- makes it its subject's last applied event.
-- ?: lane, type, applied_at (epoch ms), event id.
UPDATE `{table}` SET lane = ?, `type` = ?, applied_at = ? WHERE event_id = ?
