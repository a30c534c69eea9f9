-- What check_clearance recorded about a change's target files (SHA-256 of
-- each file's content when clearance was asked, NULL hash: the file did not
-- exist), so an approved change can be applied after a server restart
-- without `force`, and when it was applied, so a replay is refused.
-- files: JSON array of [path, hex hash or null].
CREATE TABLE mcp_clearances (
    request_id TEXT PRIMARY KEY NOT NULL,
    session_id TEXT NOT NULL,
    files TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    applied_at INTEGER
);
