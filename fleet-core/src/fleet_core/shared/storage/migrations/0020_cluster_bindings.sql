-- What a cluster may serve, and placements whatever the arrival order.

-- The admin's binding of a cluster (ADR 0020): the served model names it may report and where its
-- endpoints may be (CIDRs or host names). A cluster without a row serves nothing.
CREATE TABLE cluster_bindings (
    cluster_id     text PRIMARY KEY,
    served_models  text[] NOT NULL,
    endpoints      text[] NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text NOT NULL  -- the credential id that set it; never a secret
);
