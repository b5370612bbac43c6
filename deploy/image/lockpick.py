"""Picks entries of requirements.lock for an image build, with the image's own Python.

The lock pins the whole workspace, dev tools included, for the host that ran ``make lock``. An
image needs only what its packages require, under the markers of the image's interpreter (Debian's
3.11.2 is not the host's 3.11.x). So the build asks pip to resolve the image's packages against
the lock's versions (``--pins``: the lock without hashes, as a constraints file), reads pip's
installation report, and installs exactly those packages from the lock, hashes and all
(``--report``). A package pip wants that the lock does not pin fails the build.

    python3 lockpick.py requirements.lock --pins > pins.txt
    python3 lockpick.py requirements.lock --only hatchling packaging > build.txt
    python3 lockpick.py requirements.lock --report report.json > runtime.txt

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def entries(lock: str) -> dict[str, tuple[str, str]]:
    """name → (version, the entry's text: pin line and hashes, without ``# via`` comments)."""
    blocks: list[list[str]] = []
    for line in lock.splitlines():
        if _PIN.match(line):
            blocks.append([line])
        elif line.startswith("    --hash=") and blocks:
            blocks[-1].append(line)
    found = {}
    for block in blocks:
        match = _PIN.match(block[0])
        assert match is not None
        found[normalize(match[1])] = (match[2], "\n".join(block))
    return found


def pins(lock: str) -> str:
    """The lock as a constraints file: ``name==version`` only (markers dropped: pip evaluates
    the requirements' own markers; a constraint applies only when a package is wanted)."""
    return "".join(f"{n}=={v}\n" for n, (v, _) in sorted(entries(lock).items()))


def pick(lock: str, wanted: dict[str, str | None]) -> str:
    """The lock's entries for ``wanted`` (name → version pip chose, or None for any)."""
    pinned, out = entries(lock), []
    for name, version in sorted(wanted.items()):
        if name not in pinned:
            raise SystemExit(f"lockpick: {name} is not in requirements.lock: run `make lock`")
        if version is not None and pinned[name][0] != version:
            raise SystemExit(
                f"lockpick: pip chose {name} {version}, the lock pins {pinned[name][0]}"
            )
        out.append(pinned[name][1])
    return "\n".join(out) + "\n"


def reported(report: Path) -> dict[str, str | None]:
    """What pip's ``--report`` would install, our own packages left out."""
    items = json.loads(report.read_text())["install"]
    chosen = {normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    return {n: v for n, v in chosen.items() if not n.startswith("fleet-")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lock", type=Path)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--pins", action="store_true", help="the lock as constraints")
    action.add_argument("--only", nargs="+", metavar="NAME", help="these packages' entries")
    action.add_argument("--report", type=Path, help="the entries pip's report installs")
    args = parser.parse_args()
    lock = args.lock.read_text()
    if args.pins:
        sys.stdout.write(pins(lock))
    elif args.only:
        sys.stdout.write(pick(lock, {normalize(n): None for n in args.only}))
    else:
        sys.stdout.write(pick(lock, reported(args.report)))


if __name__ == "__main__":
    main()
