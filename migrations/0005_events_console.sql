-- The operator event journal behind `GET /api/events` (Server-Sent Events):
-- every OperatorEvent the operator side sees, in the order it was emitted,
-- with an increasing id so a client that reconnects with Last-Event-ID gets
-- exactly what it missed, also across a server restart. Written by one task
-- (src/journal.rs) in batches; kind is the event's tag (request_opened, ...),
-- payload the event as JSON; at is Unix milliseconds. No foreign key: events
-- outlive a session row deleted after a failed start.
CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    session_id TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    payload    TEXT    NOT NULL
);

CREATE INDEX events_by_session ON events (session_id, id);

-- Logins to the web console: the SHA-256 of the session cookie (never the
-- cookie itself), its CSRF token and expiry (Unix ms). Stored so a console
-- stays logged in across a server restart and a logout really ends it.
CREATE TABLE console_logins (
    cookie_hash TEXT    PRIMARY KEY NOT NULL,
    csrf        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
