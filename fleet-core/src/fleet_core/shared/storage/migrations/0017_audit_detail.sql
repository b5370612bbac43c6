-- What a change changed, beside who made it: for a rate (cost or model rate) the values it set
-- and, where it replaced one, the values before. JSON; NULL for events that record none.
ALTER TABLE audit_events ADD COLUMN detail jsonb;
