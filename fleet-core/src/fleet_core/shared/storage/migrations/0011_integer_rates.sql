-- Unit rates become integers: micro-units per 1,000 tokens (numbered 0011 after
-- 0010_auth, leaving 0008-0009 to work then in flight elsewhere).
--
-- 0004 kept rates as double precision units per million tokens and the gateway multiplied and
-- rounded in floating point, half to even. A rate is now an exact integer and a request's
-- micro-units are Σ tokens × rate / 1000 rounded once, halves up (fleet_core/shared/pricing.py).
-- The API still speaks units per million tokens (the same number / 1000, at most three decimals).
-- An existing rate with more decimals than that is rounded to the nearest thousandth here.
ALTER TABLE model_rates
    ADD COLUMN input_fresh_micro_per_1k  bigint,
    ADD COLUMN input_cached_micro_per_1k bigint,
    ADD COLUMN output_micro_per_1k       bigint;

UPDATE model_rates SET
    input_fresh_micro_per_1k = round(input_fresh::numeric * 1000),
    input_cached_micro_per_1k = round(input_cached::numeric * 1000),
    output_micro_per_1k = round(output::numeric * 1000);

ALTER TABLE model_rates
    ALTER COLUMN input_fresh_micro_per_1k SET NOT NULL,
    ALTER COLUMN input_cached_micro_per_1k SET NOT NULL,
    ALTER COLUMN output_micro_per_1k SET NOT NULL,
    ADD CONSTRAINT model_rates_input_fresh_micro_per_1k_check CHECK (input_fresh_micro_per_1k >= 0),
    ADD CONSTRAINT model_rates_input_cached_micro_per_1k_check CHECK (input_cached_micro_per_1k >= 0),
    ADD CONSTRAINT model_rates_output_micro_per_1k_check CHECK (output_micro_per_1k >= 0),
    DROP COLUMN input_fresh,
    DROP COLUMN input_cached,
    DROP COLUMN output;
