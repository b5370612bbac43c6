-- The ledger's key (request_id) is minted by the gateway for each request; a client's own
-- X-Request-Id used to be taken as the key, so two requests sending the same id (a retrying
-- client, or another tenant's reused id) became one row and one of them was never billed.
-- The client's id is kept here, beside the key: not unique, never trusted, for lookups only.
ALTER TABLE ledger ADD COLUMN client_request_id text;
CREATE INDEX ledger_tenant_client_request ON ledger (tenant, client_request_id)
    WHERE client_request_id IS NOT NULL;
