-- Tenants, projects, keys and budget rules: what the gateway admits against in database mode.
CREATE TABLE tenants (
    id            text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'),
    name          text NOT NULL,
    request_limit integer CHECK (request_limit > 0),
    token_limit   bigint CHECK (token_limit > 0),
    active        boolean NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE projects (
    id            text PRIMARY KEY,  -- tenant/name
    tenant_id     text NOT NULL REFERENCES tenants (id),
    name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$'),
    request_limit integer CHECK (request_limit > 0),
    token_limit   bigint CHECK (token_limit > 0),
    active        boolean NOT NULL DEFAULT true,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, name)
);

CREATE TABLE api_keys (
    id           text PRIMARY KEY,
    project_id   text NOT NULL REFERENCES projects (id),
    label        text NOT NULL,
    prefix       text NOT NULL,
    secret_hash  bytea NOT NULL UNIQUE,  -- SHA-256 of the secret; the secret itself is never kept
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);

CREATE TABLE budget_rules (
    id         text PRIMARY KEY,
    scope_kind text NOT NULL CHECK (scope_kind IN ('tenant', 'project')),
    scope_id   text NOT NULL,
    dimension  text NOT NULL CHECK (dimension IN ('tokens_total', 'tokens_input', 'tokens_output',
                                                  'tokens_cached', 'tokens_fresh', 'units')),
    "limit"    bigint NOT NULL CHECK ("limit" > 0),
    window_s   integer NOT NULL CHECK (window_s > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX budget_rules_scope ON budget_rules (scope_kind, scope_id);

-- Inventory: the newest report per cluster, and every report's GPU count as a time series
-- (the capacity the cost pool of a month is computed from).
CREATE TABLE inventory_reports (
    cluster_id  text PRIMARY KEY,
    observed_at timestamptz NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    report      jsonb NOT NULL
);

CREATE TABLE capacity_samples (
    cluster_id  text NOT NULL,
    observed_at timestamptz NOT NULL,
    gpus        integer NOT NULL CHECK (gpus >= 0),
    PRIMARY KEY (cluster_id, observed_at)
);
