"""``python -m fleet_core.control_plane``: the same as the ``fleet-apiserver`` console script."""

from fleet_core.control_plane.main import apiserver_main

if __name__ == "__main__":  # importing every module (the P7 import check) must not start a server
    apiserver_main()
