"""``python -m fleet_core.cli.smoke``: the same as ``fleet smoke``."""

from fleet_core.cli.smoke.cli import main

if __name__ == "__main__":  # importing every module (the P7 import check) must not run it
    main()
