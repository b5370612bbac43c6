-- How many requests per model, hour and count method had an engine usage figure out of bounds
-- (negative, more completion than was reserved, a prompt far past the gateway's own count),
-- billed at the bound instead (gateway/metering/bounds.py). Kept by the ledger writer with the
-- rest of agreement_hour. No backfill: before bounds, every row billed the engine's figures as
-- reported, so no earlier row has a figure billed at a bound.
ALTER TABLE agreement_hour ADD COLUMN out_of_bounds bigint NOT NULL DEFAULT 0;
