"""``bench.bytecodes``: the tracer counts what each function executes, and the comparison ranks
the functions that differ most. Run in a subprocess: the tracer replaces ``sys.settrace``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import bytecodes

_PROGRAM = """
import json
from bench.bytecodes import Counter

def work(n):
    total = 0
    for i in range(n):
        total += i
    return total

def idle():
    return None

counter = Counter()
counter.start()
work(10)
counter.stop()
ten = counter.snapshot()
counter.counts.clear()
counter.start()
work(20)
idle()
counter.stop()
print(json.dumps([ten, counter.snapshot()]))
"""


def test_the_counter_counts_each_function_by_what_it_executed() -> None:
    e2e = Path(bytecodes.__file__).resolve().parents[1]  # where `bench` imports from
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, cwd=e2e)
    assert done.returncode == 0, done.stderr
    ten, twenty = json.loads(done.stdout)
    work = next(name for name in ten if name.endswith(":work"))
    assert twenty[work] > 1.8 * ten[work]  # twice the loop, the same set-up
    assert any(name.endswith(":idle") for name in twenty)
    assert not any(name.endswith(":idle") for name in ten)


def test_differences_rank_the_largest_change_first_either_way() -> None:
    base = {"a": 10.0, "b": 100.0, "c": 5.0}
    other = {"a": 12.0, "b": 60.0, "d": 30.0}
    ranked = bytecodes.differences(base, other, top=3)
    assert ranked == [("b", 100.0, 60.0), ("d", 0.0, 30.0), ("c", 5.0, 0.0)]
