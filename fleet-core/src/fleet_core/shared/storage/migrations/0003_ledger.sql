-- The usage ledger: one row per gateway request, written in batches by fleet_core.gateway.ledger.
-- request_id is the idempotency key: a batch replayed from the writer's spool after an outage
-- inserts nothing twice. Both measurements are kept (P6), next to the billed figures chosen from
-- them (the engine's when it reported usage, else the gateway's count).
CREATE TABLE ledger (
    request_id               text PRIMARY KEY,
    received_at              timestamptz NOT NULL,
    first_byte_at            timestamptz,
    done_at                  timestamptz NOT NULL,
    tenant                   text,
    project                  text,
    key_id                   text,
    model                    text NOT NULL,
    served_model             text NOT NULL,
    endpoint                 text,
    kind                     text NOT NULL,
    status                   integer NOT NULL,
    outcome                  text NOT NULL,
    stream                   boolean NOT NULL,
    engine_prompt_tokens     bigint,  -- the engine's three are NULL when it sent no usage
    engine_completion_tokens bigint,
    engine_cached_tokens     bigint,
    gw_prompt_tokens         bigint NOT NULL,
    gw_completion_tokens     bigint NOT NULL,
    count_method             text NOT NULL,
    prompt_tokens            bigint NOT NULL,  -- billed
    completion_tokens        bigint NOT NULL,
    cached_tokens            bigint NOT NULL,
    fresh_tokens             bigint NOT NULL,
    units                    bigint,  -- micro-units; NULL until rates exist
    recorded_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_tenant_done ON ledger (tenant, done_at);
CREATE INDEX ledger_project_done ON ledger (project, done_at);

-- Per-minute sums of the ledger (by done_at, in UTC), kept by the writer in the same transaction
-- as the rows it inserts, so budgets and dashboards read minutes rather than requests.
-- tenant and project are '' for requests that had none (primary-key columns cannot be NULL).
CREATE TABLE usage_minute (
    tenant        text NOT NULL,
    project       text NOT NULL,
    model         text NOT NULL,
    minute        timestamptz NOT NULL,
    requests      bigint NOT NULL,
    tokens_input  bigint NOT NULL,
    tokens_output bigint NOT NULL,
    tokens_cached bigint NOT NULL,
    tokens_fresh  bigint NOT NULL,
    units         bigint NOT NULL,  -- micro-units over the priced rows only
    PRIMARY KEY (tenant, project, model, minute)
);
CREATE INDEX usage_minute_project ON usage_minute (project, minute);
