"""The compatibility check: the current wire types against the last released schema snapshots.

Run as ``python -m fleet_contract.compat`` (``make check`` and CI do). The contract has two
documents, the inventory report and a registry model's weights; each released version has a JSON
Schema snapshot of each in ``contract/schemas/{document}-v{X.Y.Z}.json``. The check diffs the
schema of the types in this checkout against each document's newest snapshot and fails on a
breaking change unless the major version was bumped (ADR 0001 gives the rules and why each one
breaks).

Breaking, from the point of view of a reader and a writer one version apart:
  removed      a field an older writer sends, or an older reader needs, is gone (renames too)
  type         a field's type, format or item type changed
  required     an optional field became required, or a new field is required
  narrowed     a constraint tightened (a minimum raised, a pattern changed) or an enum value
               removed: an older writer's valid report is now refused
  enum-added   an enum value added: an older reader refuses a report that uses it
Additive (passes): a new optional field, a constraint loosened.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Change", "CheckResult", "check", "compare", "main"]

Schema = Mapping[str, Any]
SNAPSHOT = re.compile(r"^(?P<document>[a-z]+)-v(\d+)\.(\d+)\.(\d+)\.json$")
DEFAULT_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems")


@dataclass(frozen=True)
class Change:
    """One difference between two schemas, at a wire path such as ``$.nodes[].gpus[].count``."""

    path: str
    kind: str
    detail: str
    breaking: bool

    def __str__(self) -> str:
        tag = "BREAKING" if self.breaking else "additive"
        return f"{tag} {self.kind} at {self.path}: {self.detail}"


class _Differ:
    """Walks two schemas side by side, resolving ``$ref`` against each one's own ``$defs``.

    The report has no recursive types, so the walk needs no cycle guard; one would be added
    together with the first self-referencing struct.
    """

    def __init__(self, old: Schema, new: Schema) -> None:
        self.old_root, self.new_root = old, new
        self.changes: list[Change] = []

    def _resolve(self, schema: Schema, root: Schema) -> Schema:
        while "$ref" in schema:
            schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
        return schema

    def _add(self, path: str, kind: str, detail: str, *, breaking: bool = True) -> None:
        self.changes.append(Change(path, kind, detail, breaking))

    def diff(self, old: Schema, new: Schema, path: str) -> None:
        old, new = self._resolve(old, self.old_root), self._resolve(new, self.new_root)
        if "anyOf" in old or "anyOf" in new:
            self._diff_union(old, new, path)
        elif old.get("type") != new.get("type"):
            self._add(path, "type", f"{_describe(old)} became {_describe(new)}")
        elif old.get("type") == "object":
            self._diff_object(old, new, path)
        else:
            self._diff_scalar(old, new, path)

    def _diff_object(self, old: Schema, new: Schema, path: str) -> None:
        old_props, new_props = old.get("properties", {}), new.get("properties", {})
        old_req, new_req = set(old.get("required", ())), set(new.get("required", ()))
        for name, sub in old_props.items():
            if name not in new_props:
                self._add(f"{path}.{name}", "removed", "field removed or renamed")
            else:
                self.diff(sub, new_props[name], f"{path}.{name}")
                if name in new_req and name not in old_req:
                    self._add(f"{path}.{name}", "required", "optional field made required")
        for name in new_props.keys() - old_props.keys():
            if name in new_req:
                self._add(f"{path}.{name}", "required", "new field is required")
            else:
                self._add(f"{path}.{name}", "added", "new optional field", breaking=False)
        if "additionalProperties" in old or "additionalProperties" in new:
            self._diff_extra(
                old.get("additionalProperties", {}), new.get("additionalProperties", {}), path
            )

    def _diff_extra(self, old: Schema | bool, new: Schema | bool, path: str) -> None:
        """``additionalProperties``: a schema for map values, or ``false`` when unknown fields
        are forbidden (msgspec's ``forbid_unknown_fields``), which makes every field a newer
        writer adds an error for this reader."""
        if isinstance(old, bool) or isinstance(new, bool):
            if old is False and new is not False:
                self._add(f"{path}{{}}", "loosened", "unknown fields allowed", breaking=False)
            elif new is False and old is not False:
                self._add(f"{path}{{}}", "narrowed", "unknown fields forbidden; readers would "
                          "refuse every field a newer writer adds")  # fmt: skip
            return
        self.diff(old, new, f"{path}{{}}")

    def _diff_union(self, old: Schema, new: Schema, path: str) -> None:
        old_arms = {_signature(self._resolve(s, self.old_root)): s for s in _arms(old)}
        new_arms = {_signature(self._resolve(s, self.new_root)): s for s in _arms(new)}
        if old_arms.keys() != new_arms.keys():
            self._add(path, "type", f"{_describe(old)} became {_describe(new)}")
            return
        for sig, sub in old_arms.items():
            self.diff(sub, new_arms[sig], path)

    def _diff_scalar(self, old: Schema, new: Schema, path: str) -> None:
        if old.get("format") != new.get("format"):
            self._add(path, "type", f"format {old.get('format')} became {new.get('format')}")
        if old.get("type") == "array":
            self.diff(old.get("items", {}), new.get("items", {}), f"{path}[]")
        self._diff_enum(old, new, path)
        self._diff_bounds(old, new, path)

    def _diff_enum(self, old: Schema, new: Schema, path: str) -> None:
        if "enum" not in old and "enum" not in new:
            return
        if "enum" not in old:
            self._add(path, "narrowed", "value restricted to an enum")
            return
        before, after = set(old["enum"]), set(new.get("enum", old["enum"]))
        for value in sorted(before - after, key=str):
            self._add(path, "narrowed", f"enum value {value!r} removed")
        for value in sorted(after - before, key=str):
            self._add(path, "enum-added", f"enum value {value!r} added; older readers refuse it")

    def _diff_bounds(self, old: Schema, new: Schema, path: str) -> None:
        for key in (*_LOWER_BOUNDS, *_UPPER_BOUNDS, "pattern"):
            before, after = old.get(key), new.get(key)
            if before == after:
                continue
            if after is None:
                self._add(path, "loosened", f"{key} {before} dropped", breaking=False)
            elif before is None or key == "pattern" or (key in _LOWER_BOUNDS) == (after > before):
                self._add(path, "narrowed", f"{key} {before} became {after}")
            else:
                self._add(path, "loosened", f"{key} {before} became {after}", breaking=False)


def _arms(schema: Schema) -> Sequence[Schema]:
    return list(schema.get("anyOf", [schema]))


def _signature(schema: Schema) -> str:
    return f"{schema.get('type', 'any')}:{schema.get('format', '')}:{schema.get('title', '')}"


def _describe(schema: Schema) -> str:
    if "anyOf" in schema:
        return " | ".join(_describe(arm) for arm in schema["anyOf"])
    return str(
        schema.get("title")
        or schema.get("$ref", "").rsplit("/", 1)[-1]
        or schema.get("type", "any")
    )


def compare(old: Schema, new: Schema) -> list[Change]:
    """Every difference between two report schemas, breaking ones flagged."""
    differ = _Differ(old, new)
    differ.diff(old, new, "$")
    return differ.changes


Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    major, minor, patch = (int(part) for part in text.split("."))
    return major, minor, patch


def snapshots(directory: Path, document: str = "inventory") -> Iterator[tuple[Version, Path]]:
    """Released versions of ``document`` found in ``directory``, in no particular order."""
    for path in directory.glob(f"{document}-v*.json"):
        if (match := SNAPSHOT.match(path.name)) and match["document"] == document:
            yield (int(match[2]), int(match[3]), int(match[4])), path


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    baseline: Version | None
    changes: list[Change]
    message: str


def check(
    current: Schema, version: Version, directory: Path, document: str = "inventory"
) -> CheckResult:
    """Judge the current schema at ``version`` against the newest snapshot in ``directory``."""
    found = sorted(snapshots(directory, document))
    if not found:
        return CheckResult(False, None, [], f"no snapshot in {directory}: nothing to compare with")
    baseline, path = found[-1]
    shown = ".".join(map(str, baseline))
    if version < baseline:
        return CheckResult(False, baseline, [], f"version {_fmt(version)} is older than {shown}")
    changes = compare(json.loads(path.read_text()), current)
    breaking = [c for c in changes if c.breaking]
    if breaking and version[0] == baseline[0]:
        msg = f"{len(breaking)} breaking change(s) against {shown} without a major version bump"
        return CheckResult(False, baseline, changes, msg)
    verdict = "major bump: breaking changes allowed" if breaking else "compatible"
    return CheckResult(True, baseline, changes, f"{verdict} with {shown}")


def _fmt(version: Version) -> str:
    return ".".join(map(str, version))


def write_snapshot(
    current: Schema, version: Version, directory: Path, document: str = "inventory"
) -> Path:
    """Record ``current`` as the released schema of ``version``; a released one never changes."""
    path = directory / f"{document}-v{_fmt(version)}.json"
    text = json.dumps(current, indent=2, sort_keys=True) + "\n"
    if path.exists() and path.read_text() != text:
        raise SystemExit(f"{path.name} is released and differs; bump the version instead")
    path.write_text(text)
    return path


def documents() -> dict[str, Callable[[], Schema]]:
    """Each document of the contract and the function giving its current schema."""
    from fleet_contract import report_schema, weights_schema

    return {"inventory": report_schema, "weights": weights_schema}


def main(argv: Sequence[str] | None = None) -> int:
    from fleet_contract import __version__

    parser = argparse.ArgumentParser(
        prog="python -m fleet_contract.compat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--schemas", type=Path, default=DEFAULT_SCHEMAS)
    parser.add_argument(
        "--write-snapshot",
        action="store_true",
        help="record the current schema as this version's release snapshot",
    )
    args = parser.parse_args(argv)
    version = parse_version(__version__)
    ok = True
    for document, schema in documents().items():
        if args.write_snapshot:
            print(f"wrote {write_snapshot(schema(), version, args.schemas, document)}")
            continue
        result = check(schema(), version, args.schemas, document)
        for change in result.changes:
            print(f"  {change}")
        verdict = "ok" if result.ok else "FAILED"
        print(f"contract {__version__}, {document}: {verdict}: {result.message}")
        ok = ok and result.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
