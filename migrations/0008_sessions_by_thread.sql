-- A Slack reply in a thread of a session without a running agent finds its
-- session by (channel, thread): one index lookup, not a scan of every
-- session ever kept.
CREATE INDEX sessions_thread ON sessions (channel_id, thread_ts);
