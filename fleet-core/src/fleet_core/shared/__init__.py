"""What the gateway and the control plane both run: errors, logs, settings readers, the ASGI
server wrapper, storage and migrations, paging, credentials' digests, unit-rate arithmetic and the
endpoints document. Nothing here imports a deployable's code (an import-linter layers contract)."""
