-- What a cluster may serve, report times, and placements whatever the arrival order.

-- The admin's binding of a cluster (ADR 0020): the served model names it may report and where its
-- endpoints may be (CIDRs or host names). A cluster without a row serves nothing.
CREATE TABLE cluster_bindings (
    cluster_id     text PRIMARY KEY,
    served_models  text[] NOT NULL,
    endpoints      text[] NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text NOT NULL  -- the credential id that set it; never a secret
);

-- Placements from every report, whatever the arrival order. The AFTER trigger of 0005/0012 ran
-- only when the newest-report row changed: the store's upsert keeps a newer report in place, so
-- a late, older report updated nothing and its endpoints were never placed (its capacity sample
-- was kept), leaving that endpoint's requests unplaced over the window it alone vouched for.
-- A BEFORE INSERT row trigger fires for every proposed row of INSERT ... ON CONFLICT, whether
-- the row is then inserted, updates or is skipped, so every report reaching the table places
-- its endpoints (0012's function already splits versions whatever the order). Same body as
-- 0012's; a BEFORE trigger returns NEW.
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
    RETURN NEW;  -- a BEFORE trigger: the row goes on to be inserted (or to update)
END;
$$;

DROP TRIGGER inventory_reports_placements ON inventory_reports;
CREATE TRIGGER inventory_reports_placements BEFORE INSERT ON inventory_reports
    FOR EACH ROW EXECUTE FUNCTION fleet_record_placements();
