-- Approval rules created by operators ("allow always" / "reject always" on a
-- request, `/intercom rules`, the API). Config-file rules are not stored:
-- they are reloaded with the file.
--
-- scope_id is the workspace id for 'workspace' rules, the session id for
-- 'session' rules and NULL for 'global' ones. "match" holds the rule's
-- conditions as JSON (the core's RuleMatch: kind, paths, command_prefix,
-- command_regex, agent). created_at is Unix milliseconds.

CREATE TABLE rules (
    id         TEXT    PRIMARY KEY NOT NULL,
    scope      TEXT    NOT NULL CHECK (scope IN ('global', 'workspace', 'session')),
    scope_id   TEXT,
    "match"    TEXT    NOT NULL DEFAULT '{}',
    action     TEXT    NOT NULL CHECK (action IN ('allow', 'ask', 'deny')),
    created_by TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    CHECK ((scope = 'global') = (scope_id IS NULL))
);

CREATE INDEX rules_scope ON rules (scope, scope_id);
