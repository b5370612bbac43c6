"""``python -m fleet_core.smoke``: the same as ``fleet smoke``."""

from fleet_core.smoke.cli import main

main()
