"""The Python API: run the stages from Python and read the results as Arrow tables or pandas.

    from pipelines import api

    results = api.run("small_binary_rr", output="results", seed=1)
    results.reports()            # pyarrow.Table: one row per crowd and window (ε_ℓ, ε_c, n, ...)
    results.histograms()         # pyarrow.Table: estimates, standard errors, truth per bucket
    results.to_pandas("reports") # a pandas DataFrame (pip install '.[pandas]')

Each function takes the ``esa`` command's flags as keyword arguments (``crowd_threshold=500`` for
``--crowd-threshold 500``), checks them as the command does (a ``ValueError`` with the command's
one-line message) and runs the same pipeline; ``beam_flags`` are Beam's own flags
(``["--runner=FnApiRunner"]``, the default). :func:`simulate` returns simulation.json's content,
:func:`shuffle` the release's commit record, :func:`analyze` and :func:`run` a :class:`Results`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["Results", "analyze", "open_results", "run", "shuffle", "simulate"]

DEFAULT_BEAM_FLAGS = ("--runner=FnApiRunner",)
_STAGES = {
    "simulate": ("pipelines.commandline.simulate_options", "SimulateOptions", "pipelines.simulate"),
    "shuffle": ("pipelines.commandline.shuffle_options", "ShuffleOptions", "pipelines.shuffle"),
    "analyze": ("pipelines.commandline.analyze_options", "AnalyzeOptions", "pipelines.analyze"),
    "run": ("pipelines.commandline.run_options", "RunOptions", "pipelines.run"),
}


def _options(stage: str, values: dict[str, Any], beam_flags: Sequence[str] | None) -> Any:
    """Validated PipelineOptions for ``stage`` from flag names without their prefix."""
    from apache_beam.options.pipeline_options import PipelineOptions

    module_name, class_name, _ = _STAGES[stage]
    options_class = getattr(importlib.import_module(module_name), class_name)
    known = {flag.name: flag for flag in options_class.FLAGS}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"esa {stage}: unknown argument {unknown[0]!r}; known: {sorted(known)}")
    keywords = {}
    for name, value in values.items():
        if value is None:
            continue
        if known[name].repeat and isinstance(value, str | Path):
            value = [value]
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, list | tuple):
            value = [str(item) if isinstance(item, Path) else item for item in value]
        keywords[options_class.dest(known[name])] = value
    flags = list(DEFAULT_BEAM_FLAGS if beam_flags is None else beam_flags)
    options = PipelineOptions(flags, **keywords)
    errors = options.view_as(options_class).validate()
    if errors:
        raise ValueError(f"esa {stage}: {errors[0]}")
    return options, flags


def _module(stage: str) -> Any:
    return importlib.import_module(_STAGES[stage][2])


def simulate(
    recipe: str, output: str | Path, *, beam_flags: Sequence[str] | None = None, **flags: Any
) -> dict[str, Any]:
    """``esa simulate``: the device fleet's report files in ``output``; simulation.json's
    content (respondents, messages per instance, refusals, ...)."""
    options, _ = _options("simulate", {"recipe": recipe, "output": output, **flags}, beam_flags)
    return _module("simulate").run(options)


def shuffle(
    input: str | Path,
    instance: int,
    output: str | Path,
    *,
    beam_flags: Sequence[str] | None = None,
    **flags: Any,
) -> dict[str, Any]:
    """``esa shuffle``: one shuffler instance's release in ``output``; its commit record."""
    values = {"input": input, "instance": instance, "output": output, **flags}
    options, _ = _options("shuffle", values, beam_flags)
    return _module("shuffle").run(options)


def analyze(
    input: str | Path | Sequence[str | Path],
    output: str | Path,
    *,
    beam_flags: Sequence[str] | None = None,
    **flags: Any,
) -> Results:
    """``esa analyze`` over released directories: the analysis in ``output`` (report.html
    included) as :class:`Results`."""
    from pipelines import report_html, withheld_reasons

    values = {"input": input, "output": output, **flags}
    options, _ = _options("analyze", values, beam_flags)
    summary = _module("analyze").run(options)
    withheld_reasons.record_reasons(summary["inputs"]["output"])
    report_html.write_report(summary["inputs"]["output"])
    return Results(summary["inputs"]["output"])


def run(
    recipe: str = "image_grid_sealed",
    output: str | Path = "results",
    *,
    beam_flags: Sequence[str] | None = None,
    echo: bool = False,
    **flags: Any,
) -> Results:
    """``esa run``: simulate → K shufflers → analyze into ``output``; its analysis as
    :class:`Results` (``results.run`` holds run.json). ``echo`` prints what the command prints."""
    options, flags_list = _options("run", {"recipe": recipe, "output": output, **flags}, beam_flags)
    outcome = _module("run").run(options, flags_list, echo=echo)
    return Results(outcome["paths"]["analysis"], run=outcome)


def open_results(analysis_dir: str | Path) -> Results:
    """The results of an analysis already on disk (``esa analyze --output`` or
    ``OUTPUT/analysis`` of ``esa run``)."""
    return Results(analysis_dir)


class Results:
    """An analysis on disk: its tables as Arrow (or pandas), its reports and summary."""

    def __init__(self, analysis_dir: str | Path, run: dict[str, Any] | None = None) -> None:
        self.path = Path(analysis_dir)
        if not (self.path / "summary.json").is_file():
            raise ValueError(f"{self.path}: no analysis here (no summary.json)")
        self.run = run

    def __repr__(self) -> str:
        return f"Results({str(self.path)!r})"

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: inputs, metrics (read = messages + chaff + dead-lettered), totals."""
        return json.loads((self.path / "summary.json").read_text())

    @property
    def report_html(self) -> Path:
        return self.path / "report.html"

    def _parquet(self, name: str) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(str(self.path / name))

    def histograms(self) -> pa.Table:
        """histograms.parquet: per window, crowd and bucket the unbiased estimate, its standard
        error, the raw count, n, the post-processed estimate and the truth when known."""
        return self._parquet("histograms.parquet")

    def longitudinal(self) -> pa.Table:
        """longitudinal.parquet: per crowd and period f̃_t, its standard error and error bound."""
        return self._parquet("longitudinal.parquet")

    def _reports(self) -> dict[str, list[dict[str, Any]]]:
        from transforms.analyzer.report_files import read_reports

        return read_reports(str(self.path))

    def reports(self) -> pa.Table:
        """One row per estimated crowd and window: kind, channel, recipe, crowd, window start,
        n (the fewest respondents an instance released: what ε_c is for), n_eff (what the
        estimates are de-biased with), ε_ℓ∞, ε_ℓ1, ε_c from shuffling, ε_c and δ with
        randomized deletion composed in, the bound, the target, RMSE and s.e. (rms)."""
        reports = self._reports()
        rows = []
        for entry in reports["histograms"] + reports["longitudinal"]:
            privacy, accuracy = entry.get("privacy", {}), entry.get("accuracy", {})
            rows.append(
                {
                    "kind": entry.get("kind"),
                    "channel": entry.get("channel"),
                    "recipe_id": entry.get("recipe_id"),
                    "crowd_id": entry.get("crowd_id"),
                    "window_start_ms": entry.get("window_start", entry.get("round_start")),
                    "respondents": privacy.get("respondents"),
                    "respondents_effective": privacy.get("respondents_effective"),
                    "epsilon_local_all": privacy.get("epsilon_local_all"),
                    "epsilon_local_one": privacy.get("epsilon_local_one"),
                    "epsilon_central": privacy.get("epsilon_central"),
                    "epsilon_central_with_deletion": privacy.get("epsilon_central_total"),
                    "delta_with_deletion": privacy.get("delta_total", privacy.get("delta")),
                    "delta": privacy.get("delta"),
                    "bound": privacy.get("bound"),
                    "epsilon_central_target": privacy.get("epsilon_central_target"),
                    "rmse": accuracy.get("rmse"),
                    "stderr_rms": accuracy.get("stderr_rms"),
                    "error_bound": entry.get("error_bound"),
                }
            )
        return _table(rows, _REPORT_SCHEMA)

    def withheld(self) -> pa.Table:
        """One row per withheld crowd and window with the instances that withheld it and why."""
        from pipelines import withheld_reasons

        notes = withheld_reasons.explain_withheld_in(self._reports()["withheld"], self.summary)
        rows = [
            {
                "channel": note.get("channel"),
                "recipe_id": note.get("recipe_id"),
                "crowd_id": note.get("crowd_id"),
                "window_start_ms": note.get("window_start"),
                "withheld_by": [int(u) for u in note.get("withheld_by", [])],
                "estimated": bool(note.get("estimated")),
                "reason": note.get("reason"),
            }
            for note in notes
        ]
        return _table(rows, _WITHHELD_SCHEMA)

    def to_pandas(self, table: str = "reports") -> Any:
        """``reports``, ``histograms``, ``longitudinal`` or ``withheld`` as a pandas DataFrame
        (needs pandas: ``pip install '.[pandas]'``)."""
        readers = {
            "reports": self.reports,
            "histograms": self.histograms,
            "longitudinal": self.longitudinal,
            "withheld": self.withheld,
        }
        if table not in readers:
            raise ValueError(f"table must be one of {sorted(readers)}, got {table!r}")
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise ImportError(
                "Results.to_pandas needs pandas: pip install '.[pandas]' (or use the Arrow "
                f"table Results.{table}())"
            ) from None
        return readers[table]().to_pandas()


_REPORT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("channel", pa.string()),
        ("recipe_id", pa.string()),
        ("crowd_id", pa.string()),
        ("window_start_ms", pa.int64()),
        ("respondents", pa.int64()),
        ("respondents_effective", pa.float64()),
        ("epsilon_local_all", pa.float64()),
        ("epsilon_local_one", pa.float64()),
        ("epsilon_central", pa.float64()),
        ("epsilon_central_with_deletion", pa.float64()),
        ("delta_with_deletion", pa.float64()),
        ("delta", pa.float64()),
        ("bound", pa.string()),
        ("epsilon_central_target", pa.float64()),
        ("rmse", pa.float64()),
        ("stderr_rms", pa.float64()),
        ("error_bound", pa.float64()),
    ]
)
_WITHHELD_SCHEMA = pa.schema(
    [
        ("channel", pa.string()),
        ("recipe_id", pa.string()),
        ("crowd_id", pa.string()),
        ("window_start_ms", pa.int64()),
        ("withheld_by", pa.list_(pa.int32())),
        ("estimated", pa.bool_()),
        ("reason", pa.string()),
    ]
)


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)
