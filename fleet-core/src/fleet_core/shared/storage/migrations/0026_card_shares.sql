-- MIG slices priced as their part of a card (ADR 0026).

-- A capacity sample's priced MIG slices, in cards, as an exact fraction slice_num / slice_den
-- (reduced; 0/1 without slices). `gpus` keeps its meaning, whole GPUs, so every row from before
-- this migration means what it meant (no slices). numeric, not bigint: the denominator is the
-- lcm of the report's share denominators (each at most 64), which for an adversarial report
-- reaches 1.2e27.
ALTER TABLE capacity_samples
    ADD COLUMN slice_num numeric NOT NULL DEFAULT 0
        CHECK (slice_num >= 0 AND slice_num = trunc(slice_num)),
    ADD COLUMN slice_den numeric NOT NULL DEFAULT 1
        CHECK (slice_den >= 1 AND slice_den = trunc(slice_den));

-- What part of a card each of a replica's devices is: its GPU-time is gpus_per_replica ×
-- share_num / share_den. 1/1 for whole GPUs, and for every placement from before this migration.
ALTER TABLE endpoint_placements
    ADD COLUMN share_num integer NOT NULL DEFAULT 1,
    ADD COLUMN share_den integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT endpoint_placements_share
        CHECK (1 <= share_num AND share_num <= share_den AND share_den <= 64);

-- 0020's function, with the share (`gpuShare`, reduced) part of a placement: a report that
-- moves a URL from a whole GPU to a slice, or between slices of different sizes, splits its
-- version like a change of cluster or GPU count. A URL listed twice takes the larger size.
CREATE OR REPLACE FUNCTION fleet_record_placements() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    entry record;
    cur   endpoint_placements%ROWTYPE;
    nxt   endpoint_placements%ROWTYPE;
BEGIN
    FOR entry IN
        SELECT DISTINCT ON (url) url, gpus, num / gcd(num, den) AS num, den / gcd(num, den) AS den
        FROM (
            SELECT rtrim(e->>'url', '/') AS url, (d->>'gpusPerReplica')::integer AS gpus,
                   coalesce((d->'gpuShare'->>'numerator')::integer, 1) AS num,
                   coalesce((d->'gpuShare'->>'denominator')::integer, 1) AS den
            FROM jsonb_array_elements(coalesce(NEW.report->'deployments', '[]')) AS d,
                 jsonb_array_elements(coalesce(d->'endpoints', '[]')) AS e
        ) AS listed
        ORDER BY url, gpus::numeric * num / den DESC, gpus DESC, num DESC, den
    LOOP
        SELECT * INTO cur FROM endpoint_placements
        WHERE endpoint = entry.url AND valid_from <= NEW.observed_at
              AND valid_to > NEW.observed_at
        FOR UPDATE;
        IF NOT FOUND THEN  -- before the URL's first version, or never listed
            SELECT * INTO nxt FROM endpoint_placements
            WHERE endpoint = entry.url AND valid_from > NEW.observed_at
            ORDER BY valid_from LIMIT 1 FOR UPDATE;
            IF FOUND AND (nxt.cluster_id, nxt.gpus_per_replica, nxt.share_num, nxt.share_den)
                         = (NEW.cluster_id, entry.gpus, entry.num, entry.den) THEN
                UPDATE endpoint_placements
                SET valid_from = NEW.observed_at, first_seen = NEW.observed_at
                WHERE replica = nxt.replica;
            ELSE
                INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica,
                                                 share_num, share_den, first_seen, last_seen,
                                                 valid_from, valid_to)
                VALUES (entry.url, NEW.cluster_id, entry.gpus, entry.num, entry.den,
                        NEW.observed_at, NEW.observed_at, NEW.observed_at,
                        coalesce(nxt.valid_from, 'infinity'));
            END IF;
        ELSIF (cur.cluster_id, cur.gpus_per_replica, cur.share_num, cur.share_den)
              = (NEW.cluster_id, entry.gpus, entry.num, entry.den) THEN
            UPDATE endpoint_placements
            SET first_seen = least(first_seen, NEW.observed_at),
                last_seen = greatest(last_seen, NEW.observed_at)
            WHERE replica = cur.replica;
        ELSIF cur.valid_from = NEW.observed_at THEN
            UPDATE endpoint_placements
            SET cluster_id = NEW.cluster_id, gpus_per_replica = entry.gpus,
                share_num = entry.num, share_den = entry.den
            WHERE replica = cur.replica;
        ELSE
            UPDATE endpoint_placements SET valid_to = NEW.observed_at WHERE replica = cur.replica;
            INSERT INTO endpoint_placements (endpoint, cluster_id, gpus_per_replica, share_num,
                                             share_den, first_seen, last_seen, valid_from,
                                             valid_to)
            VALUES (entry.url, NEW.cluster_id, entry.gpus, entry.num, entry.den, NEW.observed_at,
                    NEW.observed_at, NEW.observed_at, cur.valid_to);
        END IF;
    END LOOP;
    RETURN NEW;  -- a BEFORE trigger: the row goes on to be inserted (or to update)
END;
$$;
