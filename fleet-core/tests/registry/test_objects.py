"""The directory store's writers under cancellation: a pull cut off mid-open leaks no file."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from pathlib import Path

import pytest

from fleet_core.registry import objects


async def test_a_writer_cancelled_while_its_file_opens_closes_the_file(tmp_path: Path) -> None:
    store = objects.DirectoryStore(tmp_path)
    opening = asyncio.create_task(store.writer("m/config.json", resume=False))
    await asyncio.sleep(0)  # the open now runs in its thread
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        await asyncio.sleep(0.2)  # the thread finishes and the file is closed, or dropped
        del opening
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert (tmp_path / objects.PARTIAL / "m" / "config.json").is_file()


def test_a_writer_cancelled_as_its_loop_ends_closes_the_file(tmp_path: Path) -> None:
    """The control plane stopping: the pull is cancelled while its file opens and the loop ends
    right after, before any callback it scheduled could run (a CI run's teardown once found the
    file open). The thread that opened the file closes it."""

    async def cut_off(key: str) -> None:
        store = objects.DirectoryStore(tmp_path)
        opening = asyncio.create_task(store.writer(key, resume=False))
        await asyncio.sleep(0)  # the open now runs in its thread
        opening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await opening

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for i in range(20):
            asyncio.run(cut_off(f"m/{i}.json"))
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert len(list((tmp_path / objects.PARTIAL / "m").iterdir())) == 20
