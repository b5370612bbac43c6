"""Development tools, never imported by what ships: the stub engine (``--demo``, tests,
benchmarks), the synthetic hub, and the ``make dev`` and ``make seed`` runners."""
