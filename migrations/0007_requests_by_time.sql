-- The approvals list (`GET /api/approvals`) is read newest first in pages
-- and stops at its bounds: this index lets it stream in that order instead
-- of sorting every request (with its diff) first.
CREATE INDEX requests_created ON requests (created_at);
