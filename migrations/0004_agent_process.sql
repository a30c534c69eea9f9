-- The agent process of a live session (pid = process group id) and its start
-- time (clock ticks since boot, /proc/<pid>/stat field 22), so a server that
-- was SIGKILLed can kill the orphaned group at the next start without ever
-- signalling a recycled pid.
ALTER TABLE sessions ADD COLUMN agent_pid INTEGER;
ALTER TABLE sessions ADD COLUMN agent_start INTEGER;
