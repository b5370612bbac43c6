"""Writes NOTICE: every third-party package that Fleet's locks pin, with its version and license.

Why a script: the lock changes with every `make lock`, and a hand-kept list goes stale the same
day. Licenses come from each package's installed metadata (`importlib.metadata`, so run it with the
interpreter of a venv built from the lock, as `make notice` does) and, for an npm lock, from the
`license` field npm records per package. The NOTICE ends with the sha256 of every lock it was
generated from; `e2e/tests/test_notice.py` regenerates it and fails when the file differs, so a
lock change without `make notice` cannot land.

Packages whose environment marker excludes this platform (Windows-only ones, say) are not installed
here: their licenses come from `ELSEWHERE`, and the script refuses to guess for one missing there.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Package", "main", "npm_packages", "python_packages", "render"]

ROOT = Path(__file__).resolve().parent.parent
PYTHON_LOCK = "requirements.lock"
NPM_LOCKS = ("web/package-lock.json",)

# Licenses of pinned packages that no supported development platform installs (checked by hand
# against each wheel's METADATA). The key is the normalized name.
ELSEWHERE = {
    "async-timeout": "Apache-2.0",  # only on Python < 3.11.3
    "colorama": "BSD-3-Clause",  # Windows
    "httpx2-jsfetch": "BSD-3-Clause",  # emscripten
    "pywin32": "PSF-2.0",  # Windows
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_CLASSIFIER = "License :: "
_SHORT_LICENSE = 80


class NoticeError(Exception):
    """A lock names a package whose license cannot be determined."""


@dataclass(frozen=True, order=True)
class Package:
    name: str
    version: str
    license: str


def normalize(name: str) -> str:
    """PEP 503 name normalization, so lock and metadata spellings compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def python_pins(lock_text: str) -> list[tuple[str, str]]:
    """The `name==version` pins of a requirements file, hashes and markers left aside."""
    return [(m[1], m[2]) for line in lock_text.splitlines() if (m := _PIN.match(line))]


def _field(meta: importlib.metadata.PackageMetadata, name: str) -> str:
    values: list[str] = meta.get_all(name) or []
    return values[0].strip() if values else ""


def metadata_license(meta: importlib.metadata.PackageMetadata) -> str | None:
    """The SPDX expression when declared, else a one-line License field, else the classifiers."""
    expression = _field(meta, "License-Expression")
    if expression:
        return expression
    declared = _field(meta, "License")
    if declared and "\n" not in declared and len(declared) <= _SHORT_LICENSE:
        return declared
    classifiers = [
        c.rsplit(" :: ", 1)[-1]
        for c in meta.get_all("Classifier") or []
        if c.startswith(_CLASSIFIER) and c.count(" :: ") >= 2
    ]
    return "; ".join(classifiers) or None


def installed_licenses() -> dict[tuple[str, str], str | None]:
    return {
        (normalize(d.metadata["Name"]), d.version): metadata_license(d.metadata)
        for d in importlib.metadata.distributions()
    }


def python_packages(lock_text: str, installed: dict[tuple[str, str], str | None]) -> list[Package]:
    packages, unknown = [], []
    for name, version in python_pins(lock_text):
        key = normalize(name)
        license_ = installed.get((key, version)) or ELSEWHERE.get(key)
        if license_ is None:
            unknown.append(f"{name}=={version}")
        else:
            packages.append(Package(key, version, license_))
    if unknown:
        raise NoticeError(
            f"no license for {', '.join(unknown)}: install the lock into this interpreter "
            "(make notice does) or, for a package this platform never installs, "
            "add it to ELSEWHERE in tools/notice.py"
        )
    return sorted(packages)


def npm_packages(lock_text: str) -> list[Package]:
    """Every package of an npm lockfile (v2/v3 `packages` map), the root project left out."""
    entries = json.loads(lock_text).get("packages", {})
    packages = set()
    for path, entry in entries.items():
        if not path or entry.get("link"):
            continue
        name = entry.get("name") or path.rsplit("node_modules/", 1)[-1]
        license_ = entry.get("license")
        if not license_:
            raise NoticeError(f"npm lock records no license for {name}@{entry.get('version')}")
        packages.add(Package(name, entry.get("version", "?"), str(license_)))
    return sorted(packages)


def section(title: str, packages: Iterable[Package]) -> list[str]:
    rows = list(packages)
    width = max((len(p.name) + len(p.version) for p in rows), default=0) + 3
    lines = [title, "-" * len(title)]
    lines += [f"{p.name} {p.version}".ljust(width) + p.license for p in rows]
    return [*lines, ""]


HEADER = """\
Fleet
Copyright The Fleet Authors

This product is licensed under the Apache License, Version 2.0 (see LICENSE).

It depends on the third-party packages listed below, each under its own license as declared in
its package metadata. Their license texts ship inside each installed package.
"""


def render(root: Path, installed: dict[tuple[str, str], str | None]) -> str:
    """The NOTICE text for the locks present under root."""
    lines = [HEADER]
    digests = []
    python_lock = (root / PYTHON_LOCK).read_text()
    lines += section(f"Python packages ({PYTHON_LOCK})", python_packages(python_lock, installed))
    digests.append((PYTHON_LOCK, python_lock))
    for relative in NPM_LOCKS:
        path = root / relative
        if path.exists():
            npm_lock = path.read_text()
            lines += section(f"JavaScript packages ({relative})", npm_packages(npm_lock))
            digests.append((relative, npm_lock))
    lines.append("Generated by `make notice` (tools/notice.py) from:")
    lines += [f"  {name} sha256:{hashlib.sha256(t.encode()).hexdigest()}" for name, t in digests]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this)")
    parser.add_argument("--check", action="store_true", help="fail if NOTICE is stale")
    args = parser.parse_args(argv)
    try:
        text = render(args.root, installed_licenses())
    except NoticeError as exc:
        print(f"notice: {exc}", file=sys.stderr)
        return 2
    notice = args.root / "NOTICE"
    if args.check:
        if notice.exists() and notice.read_text() == text:
            return 0
        print("notice: NOTICE is stale: run `make notice`", file=sys.stderr)
        return 1
    notice.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
