-- Unit rates per model, and change notifications for the gateway's database-mode caches.
--
-- A request's units are Σ tokens × rate, with each rate in units per million tokens, so the
-- ledger's micro-units are tokens × rate exactly. `model` is the name clients send (the served
-- model name); the model registry writes the same rows for its models (PATCH /models/{id}).
CREATE TABLE model_rates (
    model        text PRIMARY KEY,
    input_fresh  double precision NOT NULL CHECK (input_fresh >= 0),
    input_cached double precision NOT NULL CHECK (input_cached >= 0),
    output       double precision NOT NULL CHECK (output >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Every change to what admission reads is announced on one channel; the payload names the table.
-- The gateway LISTENs and reloads; it also polls, so a missed notification costs at most a poll.
CREATE FUNCTION fleet_notify_admission() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('fleet_admission', TG_TABLE_NAME);
    RETURN NULL;
END;
$$;

CREATE TRIGGER tenants_notify AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();
CREATE TRIGGER projects_notify AFTER INSERT OR UPDATE OR DELETE ON projects
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();
CREATE TRIGGER budget_rules_notify AFTER INSERT OR UPDATE OR DELETE ON budget_rules
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();
CREATE TRIGGER model_rates_notify AFTER INSERT OR UPDATE OR DELETE ON model_rates
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();
-- Keys: only creation and revocation matter; last_used_at updates must not wake every gateway.
CREATE TRIGGER api_keys_notify_insert AFTER INSERT OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();
CREATE TRIGGER api_keys_notify_revoke AFTER UPDATE OF revoked_at ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION fleet_notify_admission();

-- GET /usage-agreement reads raw ledger rows of a time window, across tenants.
CREATE INDEX ledger_done ON ledger (done_at);
