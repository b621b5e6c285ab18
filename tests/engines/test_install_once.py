"""Changes to Beam are installed once per process (pipelines/engines/install_once.py)."""

from __future__ import annotations

import threading

from pipelines.engines.install_once import install_once


def test_the_first_call_installs_and_every_call_returns_its_result():
    calls: list[int] = []

    @install_once
    def install(value: int) -> bool:
        calls.append(value)
        return value > 0

    assert install(3) is True
    assert install(-1) is True  # the first call's result, whatever the arguments
    assert calls == [3]
    assert install.__name__ == "install"


def test_concurrent_first_calls_install_once():
    calls: list[None] = []
    barrier = threading.Barrier(8)

    @install_once
    def install() -> bool:
        calls.append(None)
        return False

    results: list[bool] = []

    def call() -> None:
        barrier.wait()
        results.append(install())

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and results == [False] * 8
