"""``make dev``: run the whole system on embedded defaults.

For now the workspace has no service to run yet; this says what ``make dev`` will start once the
gateway and control plane exist, so a newcomer sees the plan rather than nothing.
"""

from __future__ import annotations

PLAN = """\
make dev will run, with nothing to configure:
  fleet-gateway      http://127.0.0.1:8080  OpenAI API in front of stub engines
  fleet-apiserver    http://127.0.0.1:8081  control plane (tenants, keys, ledger, inventory)
Neither exists yet in this checkout; the workspace, the contract and the tests do."""


def main() -> None:
    print(PLAN)


if __name__ == "__main__":
    main()
