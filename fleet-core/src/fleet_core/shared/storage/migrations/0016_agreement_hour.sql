-- Hourly rollups of the engine-vs-gateway token counts: the usage agreement over a
-- day or a month reads hours, not raw ledger rows. Two tables, both kept by the ledger writer in
-- the same statement as usage_minute and usage_hour (summed from the same insert's RETURNING,
-- so a replayed row adds to none of them):
--   agreement_hour: per model, hour and count method, the counts and the sums of the signed
--     relative differences (the means);
--   agreement_diff_hour: per model, hour and direction, how many requests had each exact
--     absolute relative difference (a histogram of distinct values, so the p95 read from it
--     is the same number percentile_cont gives over the raw rows).
-- A difference is (gateway - engine)::float8 / greatest(engine, 1), computed by Postgres here,
-- in the writer and in the reader alike, so its bits are the same wherever it is computed.
CREATE TABLE agreement_hour (
    model               text NOT NULL,
    hour                timestamptz NOT NULL,
    count_method        text NOT NULL,
    requests            bigint NOT NULL,
    prompt_compared     bigint NOT NULL,
    completion_compared bigint NOT NULL,
    prompt_diff_sum     float8 NOT NULL,
    completion_diff_sum float8 NOT NULL,
    PRIMARY KEY (model, hour, count_method)
);
CREATE INDEX agreement_hour_hour ON agreement_hour (hour);

CREATE TABLE agreement_diff_hour (
    model     text NOT NULL,
    hour      timestamptz NOT NULL,
    direction text NOT NULL CHECK (direction IN ('prompt', 'completion')),
    abs_diff  float8 NOT NULL,
    requests  bigint NOT NULL,
    PRIMARY KEY (model, hour, direction, abs_diff)
);
CREATE INDEX agreement_diff_hour_hour ON agreement_diff_hour (hour);

-- Backfill from the ledger while writers wait (a SHARE lock lets reads through).
LOCK TABLE ledger IN SHARE MODE;
INSERT INTO agreement_hour (model, hour, count_method, requests, prompt_compared,
                            completion_compared, prompt_diff_sum, completion_diff_sum)
SELECT model, date_trunc('hour', done_at, 'UTC'), count_method, count(*),
       count(engine_prompt_tokens), count(engine_completion_tokens),
       coalesce(sum((gw_prompt_tokens - engine_prompt_tokens)::float8
                    / greatest(engine_prompt_tokens, 1)), 0),
       coalesce(sum((gw_completion_tokens - engine_completion_tokens)::float8
                    / greatest(engine_completion_tokens, 1)), 0)
FROM ledger WHERE outcome <> 'refused' GROUP BY 1, 2, 3;

INSERT INTO agreement_diff_hour (model, hour, direction, abs_diff, requests)
SELECT model, date_trunc('hour', done_at, 'UTC'), 'prompt',
       abs((gw_prompt_tokens - engine_prompt_tokens)::float8 / greatest(engine_prompt_tokens, 1)),
       count(*)
FROM ledger WHERE outcome <> 'refused' AND engine_prompt_tokens IS NOT NULL GROUP BY 1, 2, 4
UNION ALL
SELECT model, date_trunc('hour', done_at, 'UTC'), 'completion',
       abs((gw_completion_tokens - engine_completion_tokens)::float8
           / greatest(engine_completion_tokens, 1)),
       count(*)
FROM ledger WHERE outcome <> 'refused' AND engine_completion_tokens IS NOT NULL GROUP BY 1, 2, 4;

-- Lists page on the server by keyset: an index per list's order, so a deep page
-- costs as little as the first. (Tenants and projects page by their primary key; cost rates by
-- their unique (cluster_id, effective_from).)
CREATE INDEX api_keys_created ON api_keys (created_at, id);
CREATE INDEX registry_models_created ON registry_models (created_at, id);
CREATE INDEX service_credentials_created ON service_credentials (created_at, id);
