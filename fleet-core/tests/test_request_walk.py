"""docs/architecture.md walks one chat request through the gateway, naming a module and a
function at each step. The walk is only worth reading while it matches the code: every module it
names must exist, and every function, class or method it names must be defined in one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TypeGuard

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleet-core" / "src" / "fleet_core"
WALK_HEADING = "## 4. One chat request, from socket to ledger row"
_CODE = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^[a-z_/]+\.(py|lua)$")
_NAME = re.compile(r"^_{0,2}[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def walk_text() -> str:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert WALK_HEADING in doc, f"docs/architecture.md lost its walk ({WALK_HEADING!r})"
    after = doc.split(WALK_HEADING, 1)[1]
    return after.split("\n## ", 1)[0]


def resolve(path: str) -> Path:
    """A path as the walk writes it: under fleet_core/gateway/, or from fleet_core/ on."""
    for base in (PACKAGE / "gateway", PACKAGE, PACKAGE / "gateway" / "admission"):
        if (base / path).is_file():
            return base / path
    raise AssertionError(f"the walk names {path}, which is not in fleet_core")


def defined_names(source: Path) -> set[str]:
    """Top-level functions and classes, and ``Class.member`` for every method and attribute."""
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for member in ast.walk(node):
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}.{member.name}")
                elif _on_self(member):
                    names.add(f"{node.name}.{member.attr}")
    return names


def _on_self(node: ast.AST) -> TypeGuard[ast.Attribute]:
    """``self.x``: an attribute a method sets or reads on its own instance."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def test_every_module_and_function_the_walk_names_exists() -> None:
    text = walk_text()
    spans = _CODE.findall(text)
    paths = [s for s in spans if _PATH.match(s)]
    assert len(paths) >= 15, "the walk should name the module at each step"
    modules = [resolve(p) for p in paths]
    defined = set().union(*(defined_names(m) for m in modules if m.suffix == ".py"))
    named = [s for s in spans if _NAME.match(s) and not _PATH.match(s)]
    assert len(named) >= 25, "the walk should name the function at each step"
    vocabulary = {"RateLimited", "Retry-After", "RETURNING"}  # an error, a header, SQL
    missing = [n for n in named if n not in defined and n not in vocabulary]
    assert not missing, f"architecture.md's walk names what the code does not define: {missing}"


def test_the_check_notices_a_name_the_code_lacks() -> None:
    gateway_service = PACKAGE / "gateway" / "exchange" / "service.py"
    names = defined_names(gateway_service)
    assert "GatewayService.begin" in names
    assert "GatewayService.no_such_step" not in names
