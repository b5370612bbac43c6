"""``bench.serve``'s stretch (``FLEET_BENCH_STRETCH``): the admission's time constants multiplied
for a server slowed under callgrind, and only constants the code reads when it uses them."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator

import pytest

from bench import serve


@pytest.fixture
def originals() -> Iterator[dict[tuple[str, str], float]]:
    stretched = serve.STRETCHED
    found = {(m.__name__, n): getattr(m, n) for m, n in stretched}
    yield found
    for module, name in stretched:
        setattr(module, name, found[(module.__name__, name)])


def test_stretch_multiplies_every_constant(originals: dict[tuple[str, str], float]) -> None:
    serve.stretch(30)
    for module, name in serve.STRETCHED:
        assert getattr(module, name) == pytest.approx(30 * originals[(module.__name__, name)])


def test_stretch_refuses_a_constant_that_has_gone(
    monkeypatch: pytest.MonkeyPatch, originals: dict[tuple[str, str], float]
) -> None:
    module = serve.STRETCHED[0][0]
    monkeypatch.setattr(serve, "STRETCHED", ((module, "NO_SUCH_WINDOW_S"),))
    with pytest.raises(SystemExit, match="NO_SUCH_WINDOW_S"):
        serve.stretch(2)


@pytest.mark.parametrize(("module", "name"), serve.STRETCHED)
def test_no_stretched_constant_is_bound_at_import(module: object, name: str) -> None:
    """A default argument or a class attribute copies the value at import, where a stretch
    made afterwards would not reach it: each constant is only read inside function bodies."""
    tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            defaults = [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
            assert not any(isinstance(d, ast.Name) and d.id == name for d in defaults)
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                value = getattr(statement, "value", None)
                assert not (isinstance(value, ast.Name) and value.id == name)
    reads = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
    ]
    assert reads, f"{name} is never read in {module}"
