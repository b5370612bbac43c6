"""The directory store's writers under cancellation: a pull cut off mid-open leaks no file."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_core.control_plane.registry import objects


async def cut_off_while_opening(root: Path, key: str) -> None:
    """A writer for ``key`` cancelled while its file opens in its thread."""
    opening = asyncio.create_task(objects.DirectoryStore(root).writer(key, resume=False))
    await asyncio.sleep(0)  # the open now runs in its thread
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening


@contextlib.contextmanager
def no_file_left_open() -> Iterator[None]:
    """Fails if a file was left to the garbage collector to close (it warns as it does)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


async def test_a_writer_cancelled_while_its_file_opens_closes_the_file(tmp_path: Path) -> None:
    with no_file_left_open():
        await cut_off_while_opening(tmp_path, "m/config.json")
        await asyncio.sleep(0.2)  # the thread finishes and the file is closed, or dropped
    assert (tmp_path / objects.PARTIAL / "m" / "config.json").is_file()


def test_a_writer_cancelled_as_its_loop_ends_closes_the_file(tmp_path: Path) -> None:
    """The control plane stopping: the pull is cancelled while its file opens and the loop ends
    right after, before any callback it scheduled could run (a CI run's teardown once found the
    file open). The thread that opened the file closes it."""
    with no_file_left_open():
        for i in range(20):
            asyncio.run(cut_off_while_opening(tmp_path, f"m/{i}.json"))
    assert len(list((tmp_path / objects.PARTIAL / "m").iterdir())) == 20
