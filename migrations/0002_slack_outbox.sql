-- The Slack outbox: every message bound for Slack is stored here before it
-- is sent and deleted once Slack accepted it, so a Slack outage or a server
-- restart loses nothing. Rows are sent in id order within their lane (a
-- session id, or `#<channel>` for channel notices). A row Slack refused for
-- good is kept with status 'failed' and its error, never re-sent.
--
-- slack_messages remembers the ts of messages that are later updated in place
-- (the thread root, permission requests, the plan, tool call lines).

CREATE TABLE slack_outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    lane       TEXT    NOT NULL,
    op         TEXT    NOT NULL,
    status     TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'failed')),
    error      TEXT,
    created_at INTEGER NOT NULL
);

CREATE INDEX slack_outbox_pending ON slack_outbox (status, id);

CREATE TABLE slack_messages (
    lane       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    ts         TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (lane, key)
);
