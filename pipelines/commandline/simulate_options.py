"""Flags of ``esa simulate``: :class:`SimulateOptions` (pipelines/simulate.py: the device fleet).

Declared as :class:`~pipelines.commandline.flags.Flag` entries (``pipelines/commandline/options.py``
says how stage options work).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.commandline import device_key_flags
from pipelines.commandline.flags import (
    LATEST_WINDOW_END_MS,
    MAX_MESSAGES_PER_CHUNK,
    MAX_MESSAGES_PER_SHARD,
    Flag,
    StageFlags,
    errors_of,
    int_in,
    output_directory,
    positive_finite,
)
from simulators.fleet import DEFAULT_START
from simulators.plan import SimulationPlan
from simulators.populations import MAX_RESPONDENTS

_PLAN = SimulationPlan  # defaults of the device fleet (simulators/plan.py)


def parse_start_ms(text: str) -> int:
    """``--start`` (ISO 8601; UTC when it names no zone) in ms since the epoch (ValueError)."""
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--start must be an ISO 8601 date or time, got {text!r}") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    millis = int(start.timestamp() * 1000)
    if millis < 0:
        raise ValueError(f"--start must not be before 1970-01-01, got {text!r}")
    return millis


def simulated_windows_end_ms(recipe_name: str, start_ms: int, rounds: int) -> int | None:
    """Where the last window of a simulation ends (None when the recipe does not load: the
    stage itself then says why)."""
    from schemas.recipes import load_recipe

    try:
        recipe = load_recipe(recipe_name)
        randomizer = recipe.build_randomizer()
    except (OSError, ValueError):
        return None
    periods = int(randomizer.periods) if randomizer.payload_kind == "tree_node" else 1
    return start_ms + rounds * periods * int(recipe.window_seconds) * 1000


class SimulateOptions(StageFlags, PipelineOptions):
    """Flags of ``esa simulate`` (pipelines/simulate.py: the simulated device fleet); Beam-side
    ``--simulate_<name>``."""

    PREFIX = "simulate"
    FLAGS = (
        Flag(
            "recipe",
            "Shipped recipe name (or name@version) or recipe JSON file. Default image_grid_onehot.",
            default="image_grid_onehot",
        ),
        Flag(
            "population",
            "Population spec KIND[:NAME][,KEY=VALUE]...: uniform, zipf[,exponent=S], "
            "heavy-hitters[,heavy=H,exponent=A,heavy_fraction=F], image:NAME[,size=RxC] (disc, "
            "gradient; horse, camera, moon need .[images]; or an image file), "
            "longitudinal[,changes=K]; any of them with crowds=C[,crowd_exponent=S,"
            "crowd_name=NAME] for natural crowds. Default: image:disc for image recipes, else "
            "what esa run picks for the recipe (zipf, heavy-hitters, longitudinal).",
        ),
        Flag(
            "respondents",
            "Number of devices. Required except for images (default: one respondent per unit of "
            f"luminosity; given, the image is scaled to it); 1..{MAX_RESPONDENTS:,}.",
            type=int,
        ),
        Flag(
            "output",
            "Output directory: instance=<u>/reports-<shard>.avro, truth.parquet, "
            "simulation.json (written to a temporary sibling and renamed at the end).",
        ),
        Flag(
            "seed",
            "Master seed (same seed, same files). Default: a random seed, recorded in "
            "simulation.json.",
            type=int,
        ),
        Flag(
            "rounds",
            "Reporting rounds per device (one window each; longitudinal: d windows each). "
            f"Default {_PLAN.rounds}.",
            default=_PLAN.rounds,
            type=int,
        ),
        Flag(
            "stream",
            "Write the reports window after window in compressed real time (for streaming "
            "shufflers): instance=<u>/reports-w<k>-c<j>.avro appear by atomic rename.",
            default=False,
            switch=True,
        ),
        Flag(
            "windows",
            "With --stream: the number of windows (the rounds). Default 2.",
            default=2,
            type=int,
        ),
        Flag(
            "window_seconds",
            "With --stream: wall-clock seconds per window of device time. Default 10.",
            default=10.0,
            type=float,
        ),
        Flag(
            "start",
            f"Start of window 0 (ISO 8601; UTC if no zone). Default {DEFAULT_START}.",
            default=DEFAULT_START,
        ),
        Flag(
            "device_budget",
            "Cohort epsilon each device allows the recipe's analysis and data fields (basic "
            "composition over rounds). Default: exactly enough for every round.",
            type=float,
        ),
        Flag(
            "query_class_fields",
            "Comma-separated data fields the devices' query class allows. Default: the fields "
            "the recipe reads.",
        ),
        Flag(
            "instance_weights",
            "Comma-separated trust distribution over the K shuffler instances. Default: the "
            "recipe's.",
        ),
        Flag(
            "no_device_budget",
            "Simulate devices without an on-device accountant (needed for recipes without local "
            "privacy, e.g. zero_sum_histogram).",
            default=False,
            switch=True,
        ),
        Flag(
            "codec",
            f"Avro codec. Default {_PLAN.codec}.",
            default=_PLAN.codec,
            choices=("deflate", "null", "snappy"),
        ),
        Flag(
            "compression_level",
            f"Deflate level 0-9 (-1: zlib default). Default {_PLAN.compression_level}.",
            default=_PLAN.compression_level,
            type=int,
        ),
        Flag(
            "messages_per_shard",
            "Target messages per shard (one file per shard and instance). Default "
            f"{_PLAN.messages_per_shard}; 1..{MAX_MESSAGES_PER_SHARD:,}.",
            default=_PLAN.messages_per_shard,
            type=int,
        ),
        Flag(
            "messages_per_chunk",
            "Target messages generated at once in a worker (memory bound). Default "
            f"{_PLAN.messages_per_chunk}; 1..{MAX_MESSAGES_PER_CHUNK:,}.",
            default=_PLAN.messages_per_chunk,
            type=int,
        ),
        Flag(
            "overwrite",
            "Replace an existing non-empty output directory.",
            default=False,
            switch=True,
        ),
        Flag(
            "collector",
            "Upload the fleet's reports over HTTPS to the collectors (esa collect), one URL "
            "per shuffler instance, comma-separated, in instance order (needs "
            "--device-credentials). The files in --output are written as well.",
        ),
        Flag(
            "device_credentials",
            "The devices' enrolment keys (esa keys enrol: devices.private.jsonl or its "
            "directory); the i-th simulated device signs with the i-th key.",
        ),
        Flag(
            "collector_ca",
            "CA certificate the collectors' TLS certificates are checked with "
            "(esa keys tls: ca.crt). Default: the system's.",
        ),
        Flag(
            "connections",
            "Concurrent HTTPS connections of the uploads. Default 16.",
            default=16,
            type=int,
        ),
        Flag(
            "upload_retries",
            "Retries per upload (408, 429, 5xx, connection errors). Default 8.",
            default=8,
            type=int,
        ),
    ) + device_key_flags.SIMULATE_FLAGS  # --public-key (sealed payloads)

    def validate(self, validator: Any = None) -> list[str]:
        value = self.value
        errors = errors_of(
            int_in("--respondents", value("respondents"), 1, MAX_RESPONDENTS),
            int_in("--seed", value("seed"), 0),
            int_in("--rounds", value("rounds"), 1, 2**31 - 1),
            int_in("--windows", value("windows"), 1, 2**31 - 1),
            positive_finite("--window-seconds", value("window_seconds")),
            positive_finite("--device-budget", value("device_budget"), allow_zero=True),
            int_in("--compression-level", value("compression_level"), -1, 9),
            int_in("--messages-per-shard", value("messages_per_shard"), 1, MAX_MESSAGES_PER_SHARD),
            int_in("--messages-per-chunk", value("messages_per_chunk"), 1, MAX_MESSAGES_PER_CHUNK),
            output_directory("--output", value("output")),
            int_in("--connections", value("connections"), 1, 10_000),
            int_in("--upload-retries", value("upload_retries"), 0, 100),
        )
        collector = value("collector")
        if collector is not None:
            urls = [url.strip() for url in collector.split(",")]
            if not all(url.startswith("https://") and len(url) > 8 for url in urls):
                errors.append(
                    f"--collector must be https:// URLs, comma-separated, got {collector!r}"
                )
            if value("device_credentials") is None:
                errors.append("--collector needs --device-credentials (esa keys enrol)")
        try:
            start_ms = parse_start_ms(value("start"))
        except ValueError as error:
            return [*errors, str(error)]
        if not errors:
            end = simulated_windows_end_ms(value("recipe"), start_ms, value("rounds"))
            if end is not None and end > LATEST_WINDOW_END_MS:
                errors.append(
                    f"--start {value('start')} with --rounds {value('rounds')}: the last window "
                    "ends after year 9999, beyond what Avro timestamps hold"
                )
        return errors
