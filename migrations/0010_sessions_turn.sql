-- Whether the agent was in a turn: set when a prompt is sent, cleared when
-- the turn ends. After a server crash, a session stored with a turn running
-- is asked to continue it once resumed (its approved action may not have
-- run yet), instead of being left idle.
ALTER TABLE sessions ADD COLUMN turn_running INTEGER NOT NULL DEFAULT 0;
