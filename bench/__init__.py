"""``make bench``: each measurement beside a baseline taken in the same run (docs/benchmarks.md)."""
