"""``esa experiment``: the evaluation of Section VII (esa-privacy-revisited), regenerated.

    esa experiment {heavy-hitters,images,fragments,budget-split,sketch,all} --output DIR
        [--seed S] [--quick] [--workers W] [--no-pictures] [--no-pipeline-check]
        [--check-respondents N]

Tables (the ``experiments`` package): ``heavy-hitters`` Table I; ``images`` Tables IV, VIII, IX and
III; ``sketch`` Table V; ``budget-split`` Tables VI and VII; ``fragments`` the ε columns of the
fragment tables and Table X; ``all`` every one. Full-scale rows use the exact aggregate simulator
(released bucket sums drawn from their exact distribution); one row per table is also run through
the message-level Beam pipeline (simulate → shuffle → analyze) on a smaller population and its
RMSE compared with the exact simulator's at that size (``pipeline_check.csv``).

Output (DIR): for each table ``<table>.csv`` (one record per scenario, with the paper's numbers in
``paper_*`` columns) and ``<table>.md`` (the paper's layout), PNG figures, ``timing.csv`` (seconds
per table), the check's runs under ``pipeline-check/`` and ``report.md``, which puts it all
together. ``--quick`` shrinks populations and grids to a smoke test (about a minute and a half
with the pipeline check, seconds without). The full run takes about six minutes on two free
cores (``make experiment``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from experiments.runner import run_experiment
from experiments.scenarios import ExperimentConfig
from experiments.tables import EXPERIMENT_TABLES
from pipelines.commandline.main import UsageError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``esa experiment``."""
    parser = subparsers.add_parser(
        "experiment",
        help="Regenerate the tables and figures of Section VII (esa-privacy-revisited).",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "experiment",
        choices=list(EXPERIMENT_TABLES),
        metavar="EXPERIMENT",
        help=f"one of: {', '.join(EXPERIMENT_TABLES)}",
    )
    parser.add_argument("--output", required=True, help="directory for CSV, Markdown and PNG")
    parser.add_argument(
        "--seed",
        type=int,
        default=ExperimentConfig.seed,
        help="experiment seed (default %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small populations and grids: a smoke test in seconds"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="processes of the sketch simulator (default %(default)s)",
    )
    parser.add_argument("--no-pictures", action="store_true", help="skip the PNG figures")
    parser.add_argument(
        "--no-pipeline-check", action="store_true", help="skip the message-level Beam comparison"
    )
    parser.add_argument(
        "--check-respondents",
        type=int,
        default=None,
        help="respondents of the message-level check populations "
        "(default 200,000; 20,000 with --quick)",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.check_respondents is not None and args.check_respondents < 1000:
        raise UsageError(f"--check-respondents must be >= 1000, got {args.check_respondents}")
    if args.quick:
        config = ExperimentConfig.quick_config(seed=args.seed, workers=args.workers)
    else:
        config = ExperimentConfig(seed=args.seed, workers=args.workers)
    result = run_experiment(
        args.experiment,
        Path(args.output),
        config,
        pictures=not args.no_pictures,
        pipeline_check=not args.no_pipeline_check,
        check_respondents=args.check_respondents,
        progress=sys.stderr,
    )
    for name, seconds in result.timing:
        print(f"{name}: {seconds:.1f} s")
    print(f"total: {result.seconds:.1f} s; report: {result.report}")
    return 0
