-- The cost period rules: placements kept in time, clusters that end, bounded counts.

-- A pod IP is recycled: the endpoint URL a ledger row names meant one replica in July and
-- another in August. Each placement is now a version valid over [valid_from, valid_to), from
-- the first report that listed the URL (the gateway cannot route to it before) to 'infinity',
-- split where a report placed it differently; a close joins each request to the version in
-- effect when it was received. Rows from before this migration keep '-infinity': their history
-- was not kept.
ALTER TABLE endpoint_placements DROP CONSTRAINT endpoint_placements_pkey;
ALTER TABLE endpoint_placements
    ADD COLUMN valid_from timestamptz NOT NULL DEFAULT '-infinity',
    ADD COLUMN valid_to   timestamptz NOT NULL DEFAULT 'infinity',
    ADD PRIMARY KEY (endpoint, valid_from),
    ADD CHECK (valid_from < valid_to);

-- A report at T that places a URL differently from the version covering T splits that version
-- at T: the gateway routes by the newest report, so from T on requests went to the new replica.
-- A report that agrees only widens first_seen/last_seen. Reports arriving late and out of order
-- split the version they fall in, so the tiling holds whatever the arrival order.
CREATE OR REPLACE FUNCTION fleet_record_placements() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    entry record;
    cur   endpoint_placements%ROWTYPE;
    nxt   endpoint_placements%ROWTYPE;
BEGIN
    FOR entry IN
        SELECT DISTINCT ON (url) url, gpus
        FROM (
            SELECT rtrim(e->>'url', '/') AS url, (d->>'gpusPerReplica')::integer AS gpus
            FROM jsonb_array_elements(coalesce(NEW.report->'deployments', '[]')) AS d,
                 jsonb_array_elements(coalesce(d->'endpoints', '[]')) AS e
        ) AS listed
        ORDER BY url, gpus DESC
    LOOP
        SELECT * INTO cur FROM endpoint_placements
        WHERE endpoint = entry.url AND valid_from <= NEW.observed_at
              AND valid_to > NEW.observed_at
        FOR UPDATE;
        IF NOT FOUND THEN  -- before the URL's first version, or never listed
            SELECT * INTO nxt FROM endpoint_placements
            WHERE endpoint = entry.url AND valid_from > NEW.observed_at
            ORDER BY valid_from LIMIT 1 FOR UPDATE;
            IF FOUND AND nxt.cluster_id = NEW.cluster_id AND nxt.gpus_per_replica = entry.gpus THEN
                UPDATE endpoint_placements
                SET valid_from = NEW.observed_at, first_seen = NEW.observed_at
                WHERE replica = nxt.replica;
            ELSE
                INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica,
                                                 first_seen, last_seen, valid_from, valid_to)
                VALUES (entry.url, NEW.cluster_id, entry.gpus, NEW.observed_at, NEW.observed_at,
                        NEW.observed_at, coalesce(nxt.valid_from, 'infinity'));
            END IF;
        ELSIF cur.cluster_id = NEW.cluster_id AND cur.gpus_per_replica = entry.gpus THEN
            UPDATE endpoint_placements
            SET first_seen = least(first_seen, NEW.observed_at),
                last_seen = greatest(last_seen, NEW.observed_at)
            WHERE replica = cur.replica;
        ELSIF cur.valid_from = NEW.observed_at THEN
            UPDATE endpoint_placements
            SET cluster_id = NEW.cluster_id, gpus_per_replica = entry.gpus
            WHERE replica = cur.replica;
        ELSE
            UPDATE endpoint_placements SET valid_to = NEW.observed_at WHERE replica = cur.replica;
            INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica, first_seen,
                                             last_seen, valid_from, valid_to)
            VALUES (entry.url, NEW.cluster_id, entry.gpus, NEW.observed_at, NEW.observed_at,
                    NEW.observed_at, cur.valid_to);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;

-- A cluster taken out of the fleet: its lifetime, over which coverage is computed, ends here
-- rather than at its last report. A later report from it removes the row (it is back).
CREATE TABLE cluster_decommissions (
    cluster_id         text PRIMARY KEY,
    decommissioned_at  timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL DEFAULT now()
);
