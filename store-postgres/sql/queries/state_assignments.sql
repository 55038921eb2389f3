    has_state = true,
    lanes = CASE WHEN p.has_state THEN COALESCE($10::json, p.lanes) ELSE $3::json END,
    schedule = CASE WHEN p.has_state THEN COALESCE($11::json, p.schedule) ELSE $4::json END,
    paused = CASE WHEN p.has_state THEN COALESCE($12, p.paused) ELSE $5 END,
    schema_version = CASE WHEN p.has_state THEN COALESCE($13, p.schema_version) ELSE $6 END,
    sequence = CASE WHEN p.has_state THEN COALESCE($14, p.sequence) ELSE $7 END,
    created_at = CASE WHEN p.has_state THEN p.created_at ELSE $8 END,
    updated_at = CASE WHEN p.has_state THEN COALESCE($15, p.updated_at) ELSE $9 END
