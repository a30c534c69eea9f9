-- The ACP tool kind a request was judged and shown as. "Remember" makes its
-- rule for this kind; reading it from the transcript let an agent announce
-- another kind after the decision (a "think" remembered as "edit").
ALTER TABLE requests ADD COLUMN tool_kind TEXT;
