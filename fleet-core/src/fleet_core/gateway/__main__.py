"""``python -m fleet_core.gateway``: the same as the ``fleet-gateway`` console script."""

from fleet_core.gateway.main import gateway_main

if __name__ == "__main__":  # importing every module (the P7 import check) must not start a server
    gateway_main()
