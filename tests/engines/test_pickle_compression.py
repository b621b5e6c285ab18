"""pipelines/engines/pickle_compression.py: Beam's bz2 of pickled DoFns, asked once per input."""

from __future__ import annotations

import base64
import bz2
import threading
from types import SimpleNamespace

from apache_beam.internal import cloudpickle_pickler, pickler
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline.flags import with_default_runner
from pipelines.engines.pickle_compression import remember_compression, remembering


def _counting_bz2() -> SimpleNamespace:
    """bz2, counting the calls made of it."""
    calls = {"compress": 0, "decompress": 0}

    def compress(data, compresslevel=9):
        calls["compress"] += 1
        return bz2.compress(data, compresslevel=compresslevel)

    def decompress(data):
        calls["decompress"] += 1
        return bz2.decompress(data)

    return SimpleNamespace(compress=compress, decompress=decompress, calls=calls)


def test_the_same_bytes_as_bz2_each_input_asked_once():
    codec = _counting_bz2()
    cached = remembering(codec)
    pickle_bytes = b"a DoFn's pickle " * 50
    made = cached.compress(pickle_bytes, compresslevel=9)
    assert made == bz2.compress(pickle_bytes, 9)
    assert cached.compress(bytearray(pickle_bytes), compresslevel=9) == made  # any bytes-like
    assert cached.decompress(made) == pickle_bytes  # learned from the compression
    assert codec.calls == {"compress": 1, "decompress": 0}
    assert cached.compress(pickle_bytes, compresslevel=1) == bz2.compress(pickle_bytes, 1)
    foreign = bz2.compress(b"made in another process")
    assert cached.decompress(foreign) == cached.decompress(foreign) == b"made in another process"
    assert codec.calls == {"compress": 2, "decompress": 1}


def test_what_is_kept_stays_under_its_limit_least_recently_used_first():
    codec = _counting_bz2()
    cached = remembering(codec, limit_bytes=4_000)
    inputs = [bytes([i]) * 900 for i in range(6)]
    for data in inputs:
        cached.compress(data)
    held = sum(len(key[1]) + len(value) for key, value in cached.kept.items())
    assert held <= 4_000 and len(cached.kept) < 2 * len(inputs)
    calls = codec.calls["compress"]
    cached.compress(inputs[-1])  # the newest is kept
    assert codec.calls["compress"] == calls
    cached.compress(inputs[0])  # the oldest was dropped: asked again, same bytes
    assert codec.calls["compress"] == calls + 1
    huge = bytes(range(256)) * 40  # 10 KB in: never kept
    assert cached.compress(huge) == bz2.compress(huge) and ("compress", huge, 9) not in cached.kept


def test_threads_get_bz2_s_bytes():
    cached = remembering(bz2)
    inputs = [bytes([i % 7]) * (100 + i) for i in range(40)]
    results: dict[int, list[bytes]] = {}

    def work(worker: int) -> None:
        results[worker] = [cached.decompress(cached.compress(data)) for data in inputs]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == inputs for result in results.values())


def test_installed_by_every_pipelines_options_and_pickles_still_open():
    with_default_runner(PipelineOptions([]))
    assert remember_compression() and cloudpickle_pickler.bz2 is not bz2
    value = {"recipe": "one_hot", "buckets": list(range(50))}
    encoded = pickler.dumps(value)
    assert pickler.loads(encoded) == value
    # what any other process (plain bz2) makes of it
    assert bz2.decompress(base64.b64decode(encoded)) == cloudpickle_pickler._dumps(value)
