-- The cost pool (P8): GPU-hour rates, where each replica endpoint runs, and closed months.
-- Money is integer micro-units of the rate's currency; GPU-time is integer GPU-microseconds.

-- What one GPU-hour costs on a cluster, from effective_from on ('-infinity': since always).
CREATE TABLE cost_rates (
    id               text PRIMARY KEY,
    cluster_id       text NOT NULL,
    gpu_hour_micro   bigint NOT NULL CHECK (gpu_hour_micro >= 0),
    currency         text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    effective_from   timestamptz NOT NULL DEFAULT '-infinity',
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (cluster_id, effective_from)
);

-- Which cluster a replica endpoint (a pod URL, as the ledger records it) runs in, and how many
-- GPUs it holds: the ledger knows the URL, only the inventory knows the rest. Filled from every
-- stored inventory report by the trigger below, so no report can be saved without it.
CREATE TABLE endpoint_placements (
    endpoint         text PRIMARY KEY,
    replica          integer GENERATED ALWAYS AS IDENTITY UNIQUE,  -- a cheap sort key for sweeps
    cluster_id       text NOT NULL,
    gpus_per_replica integer NOT NULL CHECK (gpus_per_replica >= 0),
    first_seen       timestamptz NOT NULL,
    last_seen        timestamptz NOT NULL
);

CREATE FUNCTION fleet_record_placements() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO endpoint_placements AS p (endpoint, cluster_id, gpus_per_replica, first_seen,
                                          last_seen)
    SELECT DISTINCT ON (url) url, NEW.cluster_id, gpus, NEW.observed_at, NEW.observed_at
    FROM (
        SELECT rtrim(e->>'url', '/') AS url, (d->>'gpusPerReplica')::integer AS gpus
        FROM jsonb_array_elements(coalesce(NEW.report->'deployments', '[]')) AS d,
             jsonb_array_elements(coalesce(d->'endpoints', '[]')) AS e
    ) AS found
    ORDER BY url, gpus DESC
    ON CONFLICT (endpoint) DO UPDATE
        SET cluster_id = excluded.cluster_id, gpus_per_replica = excluded.gpus_per_replica,
            last_seen = excluded.last_seen, first_seen = least(p.first_seen, excluded.first_seen)
        WHERE p.last_seen <= excluded.last_seen;
    RETURN NULL;
END;
$$;

CREATE TRIGGER inventory_reports_placements AFTER INSERT OR UPDATE ON inventory_reports
    FOR EACH ROW EXECUTE FUNCTION fleet_record_placements();

-- Reports stored before this migration: their endpoints too.
UPDATE inventory_reports SET report = report;

-- A closed month: the report as issued (never rewritten), and how often it was recomputed.
CREATE TABLE cost_periods (
    period        text PRIMARY KEY CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    report        jsonb NOT NULL,
    closed_at     timestamptz NOT NULL DEFAULT now(),
    recomputed_at timestamptz,
    recomputes    integer NOT NULL DEFAULT 0
);

-- The latest recomputed allocation of each closed month per tenant and project: what a re-close
-- compares against. Its first version is what the report issued.
CREATE TABLE cost_allocations (
    period    text NOT NULL REFERENCES cost_periods (period),
    tenant    text NOT NULL,  -- '' for requests without one, as in usage_minute
    project   text NOT NULL,
    allocated bigint NOT NULL,
    PRIMARY KEY (period, tenant, project)
);

-- Differences found by re-closing `from_period`, booked into the month after it (`period`).
CREATE TABLE cost_corrections (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    period      text NOT NULL,
    from_period text NOT NULL REFERENCES cost_periods (period),
    tenant      text NOT NULL,
    project     text NOT NULL,
    amount      bigint NOT NULL,
    booked_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cost_corrections_period ON cost_corrections (period);

-- Closing reads a month of the ledger by time (index ledger_done, migration 0004), and groups it
-- by tenant and project (requests without them count as ''): statistics on those expressions keep
-- the planner's estimates sane.
CREATE STATISTICS ledger_cost_keys ON (coalesce(tenant, '')), (coalesce(project, '')) FROM ledger;
