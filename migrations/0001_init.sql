-- Initial schema for agent-intercom's durable state.
--
-- Why this exists: sessions, their transcripts, the requests waiting for an
-- operator (and the decisions taken on them), queued steering and the audit
-- log must survive a server restart. All timestamps are Unix milliseconds.

CREATE TABLE sessions (
    id               TEXT    PRIMARY KEY NOT NULL,
    workspace        TEXT    NOT NULL,
    cwd              TEXT    NOT NULL,
    agent            TEXT    NOT NULL,
    protocol         TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    status_reason    TEXT,
    title            TEXT    NOT NULL,
    owner            TEXT    NOT NULL,
    acp_session_id   TEXT,
    channel_id       TEXT,
    thread_ts        TEXT,
    restart_count    INTEGER NOT NULL DEFAULT 0 CHECK (restart_count >= 0),
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    last_activity_at INTEGER NOT NULL,
    approval_mode    TEXT    NOT NULL DEFAULT 'ask'
);

CREATE INDEX sessions_status ON sessions (status);
CREATE INDEX sessions_created ON sessions (created_at, id);

CREATE TABLE messages (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role       TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    content    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE INDEX messages_session ON messages (session_id, id);

CREATE TABLE requests (
    id          TEXT    PRIMARY KEY NOT NULL,
    session_id  TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    request_id  TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    title       TEXT    NOT NULL,
    diff        TEXT,
    paths       TEXT    NOT NULL DEFAULT '[]',
    options     TEXT    NOT NULL DEFAULT '[]',
    status      TEXT    NOT NULL DEFAULT 'pending',
    wire_id     TEXT,
    created_at  INTEGER NOT NULL,
    option_id   TEXT,
    approved    INTEGER CHECK (approved IN (0, 1)),
    reason      TEXT,
    decided_by  TEXT,
    decided_at  INTEGER
);

CREATE INDEX requests_session ON requests (session_id, created_at);
CREATE INDEX requests_status ON requests (status, created_at);

CREATE TABLE steering (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT    NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    text         TEXT    NOT NULL,
    author       TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    delivered_at INTEGER
);

CREATE INDEX steering_session ON steering (session_id, delivered_at, id);

-- The audit log deliberately has no foreign key: it must be able to record
-- events about sessions that never got (or no longer have) a row, such as a
-- start that failed and was rolled back with delete_session.
CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,
    session_id TEXT,
    actor      TEXT    NOT NULL,
    action     TEXT    NOT NULL,
    detail     TEXT    NOT NULL DEFAULT 'null'
);

CREATE INDEX audit_session ON audit (session_id, id);
