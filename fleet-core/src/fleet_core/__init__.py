"""Fleet's gateway and control plane. It never imports Kubernetes.

The package is laid out by what runs where:

- ``gateway/``: the ``fleet-gateway`` process (its HTTP edge, the exchange with engines,
  admission, metering, the ledger writer, the console it serves);
- ``control_plane/``: the ``fleet-apiserver`` process and its features (tenants, API keys,
  budget rules, rates, usage, the cost pool, the model registry, inventory, credentials);
- ``cli/``: the ``fleet`` command, a client of both over HTTP;
- ``shared/``: what both servers run;
- ``devtools/``: the stub engine, the synthetic hub and the ``make dev`` runners.

``.importlinter`` keeps those layers honest.
"""

__version__ = "0.1.0"
