-- Who may call the control plane (ADR 0009): service credentials, stored like API keys (the
-- SHA-256 of a random secret, never the secret), and the audit trail of every change.
-- Numbered 0010 so the migrations of work in flight elsewhere (0007-0009) keep their numbers.
CREATE TABLE service_credentials (
    id           text PRIMARY KEY,
    role         text NOT NULL CHECK (role IN ('admin', 'finance', 'operator', 'engine',
                                               'gateway', 'metrics')),
    cluster_id   text CHECK ((role = 'operator') = (cluster_id IS NOT NULL)),
    label        text NOT NULL,
    prefix       text NOT NULL,
    secret_hash  bytea NOT NULL UNIQUE,
    created_by   text NOT NULL,  -- a credential id, or 'bootstrap' for FLEET_ADMIN_TOKEN's
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

CREATE TABLE audit_events (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text NOT NULL,  -- the credential (or API key) id; never a secret
    actor_role text NOT NULL,
    action     text NOT NULL,
    method     text NOT NULL,
    target     text NOT NULL,  -- the request path, naming what was acted on
    status     integer NOT NULL,
    request_id text
);
CREATE INDEX audit_events_at ON audit_events (at);
