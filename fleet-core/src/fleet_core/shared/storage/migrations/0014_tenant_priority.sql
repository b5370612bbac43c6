-- A tenant's priority: its weight in the gateway's fair queue when an endpoint's
-- slots are full. 1 for everyone keeps today's equal shares; bounded so one tenant cannot be
-- given a share that starves the rest entirely.
ALTER TABLE tenants
    ADD COLUMN priority integer NOT NULL DEFAULT 1 CHECK (priority BETWEEN 1 AND 100);
