"""Device sealing and analyzer opening of whole batches (simulators/sealing.py, transforms/analyzer/opening.py), without Beam."""

from __future__ import annotations

import collections
import json

import numpy as np
import pyarrow as pa
import pytest

from schemas.avro.crc32c import crc32c_many
from schemas.crypto import sealing
from schemas.crypto.analyzer_keys import KeyRing, generate_key
from schemas.crypto.sealing import recipe_pad_length
from schemas.payloads import EncodedPayloads
from schemas.recipes import RecipeError, load_recipe, recipe_from_dict
from simulators.reports import ReportBatch
from simulators.sealing import DeviceSealing
from transforms.analyzer.opening import ReleaseOpener
from transforms.shuffler import decide

DAY = 86_400_000
_KEY = generate_key()
T0 = 1_704_067_200_000


def _recipe(chaff_rate: float):
    data = json.loads(load_recipe("image_grid_sealed").to_json())
    data["chaff_rate"] = chaff_rate
    return recipe_from_dict(data)


def _batch(recipe, data: list[bytes], devices: int, presence: bool) -> ReportBatch:
    """``data`` payloads, then one presence message (empty payload) per device if ``presence``."""
    payloads = data + [b""] * (devices if presence else 0)
    n = len(payloads)
    origin = np.frombuffer(b"".join(f"d{i % devices:07d}".encode() for i in range(n)), np.uint8)
    return ReportBatch(
        shuffler_instance=0,
        channel=recipe.channel,
        recipe_id=recipe.id,
        min_crowd_size=recipe.min_crowd_size,
        origin=origin.reshape(n, 8),
        event_time_ms=T0 + np.arange(n, dtype=np.int64) * 1000,
        payloads=EncodedPayloads.from_list(payloads),
        payload_crc32c=crc32c_many(payloads),
    )


def _released(batch: ReportBatch) -> pa.RecordBatch:
    n = len(batch)
    return pa.RecordBatch.from_pydict(
        {
            "schema_version": pa.array(np.ones(n, np.int32)),
            "window_start": pa.array(np.full(n, T0, np.int64)),
            "window_end": pa.array(np.full(n, T0 + DAY, np.int64)),
            "channel": pa.array([batch.channel] * n),
            "recipe_id": pa.array([batch.recipe_id] * n),
            "crowd_id": pa.nulls(n, pa.string()),
            "payload": batch.payloads.to_arrow().cast(pa.binary()),
            "payload_crc32c": pa.array(batch.payload_crc32c.astype(np.int64)),
        }
    )


def test_seal_then_open_gives_back_every_payload_and_counts_chaff():
    recipe = _recipe(1.5)
    key = generate_key()
    data = [bytes([2, 2 * b]) for b in range(40)]  # bucket payloads
    batch = _batch(recipe, data, devices=200, presence=True)
    device = DeviceSealing(recipe, key.public, DAY, rng=np.random.default_rng(7))
    sealed = device.seal_batch(batch)
    lengths = sealed.payloads.lengths
    expected = sealing.sealed_length(recipe_pad_length(recipe))
    assert set(lengths[lengths > 0]) == {expected}
    assert int((lengths == 0).sum()) == 200  # presence is never sealed
    chaff = len(sealed) - len(batch)
    # 200 devices x (1 + Bernoulli(0.5)): 300 +- 7.1; 6 sd bounds (false failure < 1e-8).
    assert 300 - 43 <= chaff <= 300 + 43
    assert np.array_equal(sealed.payload_crc32c, crc32c_many(sealed.payloads))
    assert (sealed.event_time_ms // DAY == T0 // DAY).all()  # chaff stays in its window
    opened = ReleaseOpener(KeyRing([key]), {recipe.id: recipe}).open_batch(_released(sealed))
    assert opened.counts["chaff"] == chaff and opened.rejected_rows.size == 0
    plain = opened.columns.column("payload").to_pylist()
    assert collections.Counter(plain) == collections.Counter(batch.payloads.to_list())
    assert np.array_equal(
        opened.columns.column("payload_crc32c").to_numpy(), crc32c_many(plain).astype(np.int64)
    )


def test_chaff_is_anchored_on_presence_messages_only():
    recipe = _recipe(2.0)  # exactly two chaff messages per presence message
    key = generate_key()
    data = [bytes([2, 2 * b]) for b in range(30)]
    device = DeviceSealing(recipe, key.public, DAY, rng=np.random.default_rng(3))
    assert len(device.seal_batch(_batch(recipe, data, devices=5, presence=False))) == 30
    with_presence = _batch(recipe, data, devices=5, presence=True)
    sealed = device.seal_batch(with_presence)
    assert len(sealed) == 35 + 2 * 5
    # each device (origin) got its two chaff messages: counts per origin are data + 1 + 2
    origins = collections.Counter(bytes(row) for row in sealed.origin)
    expected = collections.Counter(bytes(row) for row in with_presence.origin)
    assert origins == expected + collections.Counter({o: 2 for o in expected})


def test_chaff_rate_is_validated_and_bounds_the_allowance():
    assert _recipe(1.5).chaff_allowance == 2 and _recipe(0).chaff_allowance == 0
    with pytest.raises(RecipeError, match="chaff_rate"):
        _recipe(-0.1)


def test_without_a_key_ring_sealed_payloads_are_refused_and_clear_ones_pass():
    recipe = _recipe(0.0)
    key = generate_key()
    clear = _batch(recipe, [bytes([2, 2 * b]) for b in range(30)], devices=5, presence=True)
    sealed = DeviceSealing(recipe, key.public, DAY, rng=np.random.default_rng(1)).seal_batch(clear)
    opener = ReleaseOpener(None, {recipe.id: recipe})
    passed = opener.open_batch(_released(clear))
    assert passed.columns.equals(_released(clear)) and not passed.counts
    refused = opener.open_batch(_released(sealed))
    assert refused.rejected_reasons == ["sealed_without_key_ring"] * 30
    assert refused.counts == {"read": 30, "rejected:sealed_without_key_ring": 30}
    assert refused.columns.column("payload").to_pylist() == [b""] * 5  # presence passes through
    # A sealed-looking payload whose stored CRC32C is wrong is left to the decoder (crc_mismatch).
    damaged = _released(sealed)
    crc = damaged.column("payload_crc32c").to_numpy().copy()
    sealed_rows = np.flatnonzero(np.asarray(damaged.column("payload").to_pylist(), object) != b"")
    crc[sealed_rows[3]] ^= 1
    damaged = damaged.set_column(7, "payload_crc32c", pa.array(crc))
    left = opener.open_batch(damaged)
    assert left.rejected_reasons == ["sealed_without_key_ring"] * 29
    assert sealed_rows[3] in left.kept_rows


@pytest.mark.parametrize("rate", [0.25, 2.0])
def test_the_shuffler_cap_allows_a_device_its_chaff(rate):
    """A device at the recipe's data cap that also sends its full chaff allowance is never
    dead-lettered over_origin_cap (transforms/shuffler/decide.py adds Recipe.chaff_allowance); the
    cap of the same recipe without chaff would cut exactly the allowance."""
    recipe, plain = _recipe(rate), _recipe(0.0)
    [cap] = set(decide.recipe_origin_caps(recipe))
    [plain_cap] = set(decide.recipe_origin_caps(plain))
    assert cap == plain_cap + recipe.chaff_allowance
    data_cap = plain_cap  # every data message the chaff-free cap allows
    batch = _batch(recipe, [bytes([2, 2 * b]) for b in range(data_cap)], devices=1, presence=True)
    # ceil(rate) chaff messages every time: the allowance, whatever the Bernoulli draws
    device = DeviceSealing(_recipe(float(recipe.chaff_allowance)), _KEY.public, DAY)
    sealed = device.seal_batch(batch)
    assert len(sealed) == data_cap + 1 + recipe.chaff_allowance
    hashes = np.zeros(len(sealed), dtype=np.uint64)  # one origin
    presence = sealed.payloads.lengths == 0
    codes = decide.screen_origin_messages(hashes, presence, cap)
    assert int((codes == decide.OVER_ORIGIN_CAP).sum()) == 0
    codes = decide.screen_origin_messages(hashes, presence, plain_cap)
    assert int((codes == decide.OVER_ORIGIN_CAP).sum()) == recipe.chaff_allowance
