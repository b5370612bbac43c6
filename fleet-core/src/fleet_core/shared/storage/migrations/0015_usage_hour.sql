-- Hourly sums of the ledger: usage over a day or a month reads hours, not minutes, so
-- a console call stays fast with millions of rows. Kept by the ledger writer in the same statement
-- as usage_minute (both summed from the same insert's RETURNING), so every hour row is exactly the
-- sum of its 60 minute rows; backfilled here from the minute rollups, under a lock that keeps
-- writers out until the backfill commits.
CREATE TABLE usage_hour (
    tenant        text NOT NULL,
    project       text NOT NULL,
    model         text NOT NULL,
    hour          timestamptz NOT NULL,
    requests      bigint NOT NULL,
    tokens_input  bigint NOT NULL,
    tokens_output bigint NOT NULL,
    tokens_cached bigint NOT NULL,
    tokens_fresh  bigint NOT NULL,
    units         bigint NOT NULL,
    PRIMARY KEY (tenant, project, model, hour)
);
-- Fleet-wide windows (the console's usage pages with no tenant) read by time first.
CREATE INDEX usage_hour_hour ON usage_hour (hour);

LOCK TABLE usage_minute IN SHARE MODE;
INSERT INTO usage_hour (tenant, project, model, hour, requests, tokens_input, tokens_output,
                        tokens_cached, tokens_fresh, units)
SELECT tenant, project, model, date_trunc('hour', minute, 'UTC'), sum(requests),
       sum(tokens_input), sum(tokens_output), sum(tokens_cached), sum(tokens_fresh), sum(units)
FROM usage_minute GROUP BY 1, 2, 3, 4;

-- The partial hours at a window's edges read minutes by time, across every tenant.
CREATE INDEX usage_minute_minute ON usage_minute (minute);
