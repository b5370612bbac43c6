"""``python -m fleet_core.smoke``: the same as ``fleet smoke``."""

from fleet_core.smoke.cli import main

if __name__ == "__main__":  # importing every module (the P7 import check) must not run it
    main()
