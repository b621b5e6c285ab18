"""transforms.common.memory: freed pages go back only once the resident set has grown past the
margin since the last release (or when it cannot be read)."""

from __future__ import annotations

import pytest

from transforms.common import memory


class _Process:
    """A resident set the test moves, and the releases asked of it (each one shrinks the
    resident set to ``after_release``)."""

    def __init__(self, resident: int | None, after_release: int | None) -> None:
        self.resident, self.after_release, self.releases = resident, after_release, 0

    def read(self) -> int | None:
        return self.resident

    def release(self) -> None:
        self.releases += 1
        self.resident = self.after_release


def _released_once() -> tuple[_Process, memory.MemoryReleaser]:
    """A releaser with a 50-byte margin after its first call, which released (500 -> 100)."""
    process = _Process(resident=500, after_release=100)
    releaser = memory.MemoryReleaser(50, process.read, process.release)
    assert releaser() is True
    assert process.releases == 1
    return process, releaser


def test_first_call_releases_and_sets_the_floor():
    process, _ = _released_once()
    assert process.resident == 100


def test_growth_within_the_margin_keeps_the_pages():
    process, releaser = _released_once()
    for resident in (120, 150, 149, 100):  # the floor is 100: 150 is still within 50
        process.resident = resident
        assert releaser() is False
    assert process.releases == 1


def test_growth_past_the_margin_releases_and_moves_the_floor():
    process, releaser = _released_once()
    process.resident, process.after_release = 151, 130
    assert releaser() is True
    process.resident = 175  # the new floor is 130: within 50 of it
    assert releaser() is False
    process.resident = 181
    assert releaser() is True
    assert process.releases == 3


def test_an_unreadable_resident_set_releases_every_time():
    process = _Process(resident=None, after_release=None)
    releaser = memory.MemoryReleaser(1 << 40, process.read, process.release)
    assert [releaser() for _ in range(3)] == [True, True, True]
    assert process.releases == 3


def test_a_zero_margin_releases_on_any_growth():
    process = _Process(resident=10, after_release=10)
    releaser = memory.MemoryReleaser(0, process.read, process.release)
    releaser()
    assert releaser() is False  # no growth at all
    process.resident = 11
    assert releaser() is True


def test_a_negative_margin_is_refused():
    with pytest.raises(ValueError, match="margin must be >= 0"):
        memory.MemoryReleaser(-1)


def test_resident_bytes_reads_this_process():
    resident = memory.resident_bytes()
    if resident is None:
        pytest.skip("no /proc/self/statm on this system")
    held = bytearray(64 << 20)
    held[::4096] = b"\x01" * len(range(0, len(held), 4096))  # every page touched
    grown = memory.resident_bytes()
    assert grown is not None and grown >= resident + (48 << 20)
    del held


def test_the_real_release_runs():
    releaser = memory.MemoryReleaser()
    assert releaser() is True  # the first call always releases


@pytest.mark.skipif(
    not __import__("sys").platform.startswith("linux"), reason="glibc's malloc_trim"
)
def test_malloc_trim_is_found_without_a_subprocess(monkeypatch):
    """glibc's malloc_trim is found among the symbols already loaded: no ``ldconfig -p`` (a
    fork of the worker) on a worker's first batch; releasing still works."""
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"a subprocess was started: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    memory._malloc_trim.cache_clear()
    try:
        trim = memory._malloc_trim()
        assert trim is not None and trim(0) in (0, 1)
        memory.release_freed_memory()
    finally:
        memory._malloc_trim.cache_clear()
