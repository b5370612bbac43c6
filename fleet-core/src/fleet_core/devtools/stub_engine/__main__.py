"""``python -m fleet_core.devtools.stub_engine``: the same as the ``fleet-stub-engine`` script."""

import sys

from fleet_core.devtools.stub_engine.main import main

if __name__ == "__main__":  # importing every module (the P7 import check) must not start a server
    sys.exit(main())
