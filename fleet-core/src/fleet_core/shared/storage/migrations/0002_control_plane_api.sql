-- What the control-plane API needs beyond 0001.
-- A tenant or project with no billed usage may be deleted; its projects and keys go with it
-- (budget rules have no foreign key, their scope being polymorphic: the tenants store deletes them).
ALTER TABLE projects
    DROP CONSTRAINT projects_tenant_id_fkey,
    ADD CONSTRAINT projects_tenant_id_fkey FOREIGN KEY (tenant_id)
        REFERENCES tenants (id) ON DELETE CASCADE;
ALTER TABLE api_keys
    DROP CONSTRAINT api_keys_project_id_fkey,
    ADD CONSTRAINT api_keys_project_id_fkey FOREIGN KEY (project_id)
        REFERENCES projects (id) ON DELETE CASCADE;
CREATE INDEX api_keys_project ON api_keys (project_id);

-- The window as the client wrote it ("7d", "1mo"), returned as given; window_s stays the
-- number the gateway enforces. NULL for rules written before this column: rendered from window_s.
ALTER TABLE budget_rules ADD COLUMN window_spec text;
