"""The ``fleet`` command: a client of the two servers' HTTP APIs, shipped with the product.
``fleet models pull|import|list|show`` drives the model registry; ``fleet smoke`` proves a
running system end to end. Nothing here imports the servers' code."""
