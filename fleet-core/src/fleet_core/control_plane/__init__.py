"""The control plane, ``fleet-apiserver``: the /api/v1 HTTP API over Postgres. One folder per
feature (tenants, api_keys, budget_rules, rates, usage, costs, registry, inventory, auth), each
with its routes, service, store and wire types; ``app`` wires them, ``access`` says which role
may call which route, ``openapi`` describes what is served."""
