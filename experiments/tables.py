"""Which builder makes each table and which tables each ``esa experiment`` subcommand builds."""

from __future__ import annotations

from collections.abc import Callable

from experiments.lab import ExperimentLab
from experiments.privacy_tables import build_fragment_epsilons, build_table_x
from experiments.records import timed
from experiments.render import Table
from experiments.utility_tables import (
    build_image_table,
    build_table_i,
    build_table_iii,
    build_table_v,
    build_table_vi,
    build_table_vii,
)

TABLE_BUILDERS: dict[str, Callable[[ExperimentLab], Table]] = {
    "I": timed(build_table_i),
    "IV": timed(lambda lab: build_image_table(lab, "horse")),
    "V": timed(build_table_v),
    "VIII": timed(lambda lab: build_image_table(lab, "map")),
    "IX": timed(lambda lab: build_image_table(lab, "child")),
    "III": timed(build_table_iii),
    "VI": timed(build_table_vi),
    "VII": timed(build_table_vii),
    "X": timed(build_table_x),
    "fragments": timed(build_fragment_epsilons),
}

# ``esa experiment NAME`` -> the tables it builds, in order (``all``: every table, ordered so
# that later tables reuse the scenarios computed for earlier ones).
EXPERIMENT_TABLES: dict[str, tuple[str, ...]] = {
    "heavy-hitters": ("I",),
    "images": ("IV", "VIII", "IX", "III"),
    "sketch": ("V",),
    "budget-split": ("VI", "VII"),
    "fragments": ("fragments", "X"),
    "all": ("I", "IV", "V", "VIII", "IX", "III", "VI", "VII", "fragments", "X"),
}


def build_tables(lab: ExperimentLab, experiment: str) -> list[Table]:
    """The tables of one ``esa experiment`` subcommand."""
    if experiment not in EXPERIMENT_TABLES:
        raise ValueError(
            f"unknown experiment {experiment!r}; choose from {', '.join(EXPERIMENT_TABLES)}"
        )
    return [TABLE_BUILDERS[key](lab) for key in EXPERIMENT_TABLES[experiment]]
