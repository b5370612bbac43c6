-- The model registry: one row per registered model, and the state of its pull.
--
-- `files` is the pull's plan and progress (the hub's file list pinned to `revision`, each with
-- its expected hash and whether it is stored), so a control plane that restarts mid-pull resumes
-- without fetching finished files again. `facts` is what verification found once Ready. Unit
-- rates are not here: they live in model_rates (0004), keyed by the model id.
CREATE TABLE registry_models (
    id          text PRIMARY KEY,
    source      jsonb NOT NULL,
    format      text CHECK (format IN ('safetensors', 'gguf')),
    status      text NOT NULL DEFAULT 'Registered'
                CHECK (status IN ('Registered', 'Pulling', 'Ready', 'Failed', 'Cancelled')),
    reason      text NOT NULL DEFAULT '',
    revision    text,
    files       jsonb NOT NULL DEFAULT '[]',
    bytes_done  bigint NOT NULL DEFAULT 0 CHECK (bytes_done >= 0),
    facts       jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX registry_models_pulling ON registry_models (status) WHERE status = 'Pulling';
