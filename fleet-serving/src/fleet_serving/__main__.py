"""``python -m fleet_serving``: the same as the ``fleet-serving`` console script."""

from fleet_serving.main import main

if __name__ == "__main__":  # importing every module (the P7 import check) must not start anything
    main()
