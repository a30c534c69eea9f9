-- An operator's pause holds steering until someone resumes the session. It
-- is kept with the session so that an agent crash restart or a server
-- restart does not quietly lift it (and deliver what was held).
ALTER TABLE sessions ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
