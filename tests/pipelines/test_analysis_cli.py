"""``esa analysis run`` end to end on a small fleet: rounds through simulate -> shuffle -> analyze,
refusals counted, budgets composed, and each device's audit log equal to what it sent."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import sqlite3
from pathlib import Path

import fastavro
import google_crc32c
import numpy as np
import pytest

from pipelines.commandline.main import main
from simulators import interactive_devices as dev
from simulators.event_store import device_path
from simulators.text_corpus import CorpusUnavailable, fortune_files

try:
    fortune_files()
    HAVE_CORPUS = True
except CorpusUnavailable:
    HAVE_CORPUS = False

needs_corpus = pytest.mark.skipif(
    not HAVE_CORPUS,
    reason="Debian's fortunes are not installed (run scripts/install_text_corpus.sh; CI does)",
)

SMALL_PLAN = {
    "devices": 300,
    "sentences_per_device": 8,
    "known_words": 12,
    "k": 5,
    "min_crowd_size": 200,
    "crowd_threshold": 50,
    "rounds": [
        {"epsilon_local": 5.0, "keep": 6},
        {"epsilon_local": 5.0, "keep": 4},
        {"epsilon_local": 5.0, "keep": 0},
    ],
    "baseline": False,
}
# The small fleet's own configuration: two rounds of epsilon 5 fit; the third is refused by
# every device (Check 1).
SMALL_FLEET = {"analysis_epsilon": 10.0, "field_epsilon": 12.0, "local_epsilon_allowed": 6.0}


def _run(tmp_path, plan, name="out", device_config=SMALL_FLEET):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))
    config = tmp_path / f"{name}-device.json"
    config.write_text(json.dumps(device_config))
    output = tmp_path / name
    code = main(["analysis", "run", "--plan", str(path), "--output", str(output),
                 "--device-config", str(config), "--runner=FnApiRunner"])  # fmt: skip
    return code, output


def _audit(capsys, output, device):
    capsys.readouterr()
    assert main(["analysis", "audit", "--output", str(output), "--device", str(device)]) == 0
    return json.loads(capsys.readouterr().out)


@needs_corpus
@pytest.mark.slow
def test_rounds_budgets_and_audit_log(tmp_path, capsys):
    code, output = _run(tmp_path, SMALL_PLAN)
    result = json.loads((output / "analysis.json").read_text())
    first = result["rounds"][0]
    assert first["n"] == 2 and first["senders"] == 300
    assert first["devices"]["answered"] + first["devices"]["random_answer"] == 300
    assert first["devices"]["events_expired"] > 0  # retention ran before the query

    # Every Report in round 1's simulation is in exactly one device's audit log, byte for byte.
    reports = []
    for path in glob.glob(str(output / "round-1" / "esa" / "simulation" / "instance=*" / "*.avro")):
        with open(path, "rb") as handle:
            reports.extend(fastavro.reader(handle))
    logged = []
    for device in range(300):
        entry = _audit(capsys, output, device)[0]
        assert entry["round"] == "round-1" and entry["recipe_id"] == first["recipe_id"]
        for message in entry["sent"]:
            payload = bytes.fromhex(message["payload_hex"])
            assert hashlib.sha256(payload).hexdigest() == message["payload_sha256"]
            assert google_crc32c.value(payload) == message["payload_crc32c"]
            logged.append((message["shuffler_instance"], payload))
    assert first["messages_logged"] == len(reports) == len(logged)
    assert sorted(logged) == sorted((r["shuffler_instance"], bytes(r["payload"])) for r in reports)

    assert "stopped" not in first, first.get("stopped")
    assert code == 0
    second, third = result["rounds"][1:]
    # Round 1 finds the most popular 2-gram; round 2's tree came from round 1's results, and its
    # recipe names the tree's hash.
    assert "of the" in first["discovered"] and first["precision_at_k"] > 0
    (crowd,) = first["privacy_report"]
    assert crowd["epsilon_central"] <= first["epsilon_local"] and crowd["bound"]
    assert second["n"] == 3 and second["prefix_tree_leaves"] == 6
    assert second["prefix_tree_sha256"][:12] in second["recipe_id"]
    # The analysis budget allows two rounds: every device refuses the third (Check 1).
    assert third["devices"]["refused_checks"] == 300 and third["stopped"]
    charged = [first["epsilon_central_charged"], second["epsilon_central_charged"]]
    assert result["composition"]["central"]["epsilon"] == pytest.approx(sum(charged))
    entries = _audit(capsys, output, 0)
    assert [e["round"] for e in entries] == ["round-1", "round-2", "round-3"]
    assert entries[2]["status"] == "refused_checks" and entries[2]["sent"] == []
    assert "analysis_epsilon_exhausted" in entries[2]["reasons"]


@needs_corpus
def test_query_outside_its_class_is_refused_by_every_device(tmp_path):
    plan = {**SMALL_PLAN, "rounds": SMALL_PLAN["rounds"][:1], "devices": 50,
            "query": "SELECT text FROM keyboard JOIN contacts USING (ts)"}  # fmt: skip
    code, output = _run(tmp_path, plan)
    assert code == 0
    (only,) = json.loads((output / "analysis.json").read_text())["rounds"]
    assert only["devices"]["refused_query"] == 50 and only["stopped"] == "no device answered"


def test_bad_plan_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"devcies": 3}))
    assert main(["analysis", "run", "--plan", str(path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown key 'devcies'" in err


# -- hostile plans: one line, exit 2, before any work ----------------------------------------------


@pytest.mark.parametrize(
    ("given", "says"),
    [
        # A plan asks; it never sets what the devices allow (their own configuration).
        ({"analysis_epsilon": 100.0}, "'analysis_epsilon' would set the devices' privacy policy"),
        ({"field_epsilon": 100.0}, "'field_epsilon' would set"),
        ({"local_epsilon_allowed": 50.0}, "'local_epsilon_allowed' would set"),
        ({"reports_allowed": 1000}, "'reports_allowed' would set"),
        ({"query_limits": {"seconds": 60}}, "'query_limits' would set"),
        ({"rounds": [{"epsilon_local": 5.0, "keep": 0, "epsilon_allowed": 9}]}, "rounds must be"),
        # Sizes out of their documented ranges.
        ({"devices": 10**12}, "devices must be in [1, 100000], got 1000000000000"),
        ({"devices": 0}, "devices must be in [1, 100000]"),
        ({"sentences_per_device": 10**6}, "sentences_per_device must be in [1, 1000]"),
        ({"known_words": 10**6}, "known_words must be in [1, 256]"),
        ({"k": -1}, "k must be in [1, 1000]"),
        ({"instances": 10**6}, "instances must be in [1, 64]"),
        ({"min_crowd_size": 10**12}, "min_crowd_size must be in"),
        ({"crowd_threshold": 2**64}, "crowd_threshold must be in"),
        ({"rounds": [{"epsilon_local": 5.0, "keep": 0}] * 17}, "rounds must be a list of 1 to 16"),
        ({"rounds": []}, "rounds must be a list of 1 to 16"),
        ({"rounds": [{"epsilon_local": 5.0, "keep": 10**9}]}, "rounds[0].keep must be in [0, 256]"),
        ({"sweep": {"epsilons_local": [1.0], "repeats": 10**9}}, "sweep.repeats must be in"),
        ({"query": "SELECT text FROM keyboard " + " " * 20_000}, "query must be SQL text"),
        ({"query": "SELECT text FROM keyboard WHERE text = '\udc80'"}, "must be UTF-8 text"),
        ({"query": "SELECT text FROM keyboard\x00"}, "query must be SQL text"),
        # Types.
        ({"seed": "x"}, "seed must be an integer in [0, 4503599627370496], got 'x'"),
        ({"seed": -1}, "seed must be in [0, 4503599627370496], got -1"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"devices": True}, "devices must be an integer"),
        ({"name": "../x"}, "name must match"),
        ({"baseline": "yes"}, "baseline must be true or false"),
        ({"delta": "1e-6"}, "delta must be a finite number in (0, 0.01]"),
        # Non-finite and absurd numbers.
        ({"delta": 0}, "delta must be a finite number in (0, 0.01]"),
        ({"delta": 0.5}, "delta must be a finite number in (0, 0.01]"),
        ({"rounds": [{"epsilon_local": -1.0, "keep": 0}]}, "rounds[0].epsilon_local must be"),
        ({"rounds": [{"epsilon_local": 0, "keep": 0}]}, "rounds[0].epsilon_local must be"),
        ({"rounds": [{"epsilon_local": 1e308, "keep": 0}]}, "rounds[0].epsilon_local must be"),
        ({"sweep": {"epsilons_local": [-3.0]}}, "sweep.epsilons_local[0] must be"),
    ],
)
def test_hostile_plan_is_one_line_exit_2_before_any_work(tmp_path, capsys, given, says):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(given))
    output = tmp_path / "o"
    assert main(["analysis", "run", "--plan", str(path), "--output", str(output)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("esa analysis: error: --plan ")
    assert says in err
    assert not output.exists()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_refused(tmp_path, capsys, constant):
    path = tmp_path / "plan.json"
    path.write_text(f'{{"delta": {constant}}}')
    assert main(["analysis", "run", "--plan", str(path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{constant} is not a number JSON allows" in err


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"analysis_epsilon": float("inf")}, "analysis_epsilon must be a number in [0, 100]"),
        ({"analysis_epsilon": -1}, "analysis_epsilon must be a number in [0, 100]"),
        ({"reports_allowed": 10**12}, "reports_allowed must be an integer in [0, 1000]"),
        ({"query_limits": {"seconds": 0}}, "query limit seconds must be in (0, 60]"),
        ({"budget": 3}, "unknown key 'budget'"),
    ],
)
def test_bad_device_config_is_one_line_exit_2(tmp_path, capsys, given, says):
    path = tmp_path / "device.json"
    path.write_text(json.dumps(given).replace("Infinity", "1e999"))
    argv = ["analysis", "run", "--device-config", str(path), "--output", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("esa analysis: error: --device-config ")
    assert says in err


# -- the rounds shuffle through esa run's shuffler: a flooding device does not move n -------------


@needs_corpus
def test_a_flooding_device_does_not_move_n(tmp_path, monkeypatch):
    """Each round's answers go through ``esa run``'s stages (simulate -> ``esa shuffle`` per
    instance -> ``esa analyze``), so the shuffler's per-origin caps and presence-based n hold for
    interactive rounds: one device's data report resent 2,000 times (by that device, same origin)
    after the fleet wrote its files leaves n at the number of devices that answered."""
    from pipelines import simulate as simulate_pipeline

    real_simulate = simulate_pipeline.run
    flood: dict[str, object] = {}

    def simulate_then_flood(options):
        summary = real_simulate(options)
        folder = Path(options.get_all_options()["simulate_output"]) / "instance=0"
        with open(sorted(folder.glob("*.avro"))[0], "rb") as handle:
            reader = fastavro.reader(handle)
            schema, reports = reader.writer_schema, list(reader)
        victim = next(report for report in reports if report["payload"])
        with open(folder / "flood.avro", "wb") as handle:
            fastavro.writer(handle, schema, [victim] * 2000)
        flood["origin"] = victim["origin"]
        return summary

    monkeypatch.setattr(simulate_pipeline, "run", simulate_then_flood)
    plan = {**SMALL_PLAN, "rounds": SMALL_PLAN["rounds"][:1]}
    code, output = _run(tmp_path, plan)
    assert flood, "the simulate stage did not run through pipelines.simulate.run"
    (only,) = json.loads((output / "analysis.json").read_text())["rounds"]
    assert only["senders"] == 300 and "stopped" not in only
    (crowd,) = only["privacy_report"]
    assert crowd["respondents_effective"] == 300
    # The shuffler saw the flood and kept at most its per-origin cap of it (whatever the reason
    # it gives the rest); the analyzer read only signed, verified releases.
    esa = output / "round-1" / "esa"
    metrics = json.loads((esa / "shuffler-0" / "private" / "metrics.json").read_text())
    assert metrics["presence"] == 300 and metrics["dead_lettered"] >= 1_900
    summary = json.loads((esa / "analysis" / "summary.json").read_text())
    assert summary["inputs"]["commit_records"].startswith("authenticated: Ed25519 signatures")
    assert code == 0


LAYERS = {"pipelines", "transforms", "schemas", "simulators", "privacy", "experiments"}


def test_interactive_analyses_reach_the_shuffler_and_releases_only_through_esa_run():
    """Statically: ``esa analysis`` (pipelines/interactive*.py) imports no shuffler code, no
    release reader and no analyzer stage of its own; its rounds run ``pipelines.run`` (whose
    stages are ``esa shuffle`` and ``esa analyze``), and of the analyzer it reads only the
    finished outputs (``transforms.analyzer.report_files``)."""
    root = Path(__file__).resolve().parents[2]
    allowed = ("pipelines.commandline", "pipelines.run", "pipelines.interactive_sweep",
               "privacy", "simulators", "transforms.analyzer.report_files")  # fmt: skip
    for name in ("interactive.py", "interactive_sweep.py"):
        tree = ast.parse((root / "pipelines" / name).read_text())
        project = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            project.update(n for n in names if n.split(".")[0] in LAYERS)
        outside = sorted(n for n in project if not n.startswith(allowed))
        assert not outside, f"pipelines/{name} imports {outside}"


def test_audit_of_a_tampered_ledger_is_one_line_exit_1(tmp_path, capsys):
    devices = tmp_path / "out" / "devices"
    dev.create_fleet(devices, [["of the people"]], 0, 86_400_000, np.random.default_rng(1))
    assert main(["analysis", "audit", "--output", str(tmp_path / "out"), "--device", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    database = sqlite3.connect(device_path(devices, 0))
    database.execute("DROP TABLE _audit")
    database.close()
    assert main(["analysis", "audit", "--output", str(tmp_path / "out"), "--device", "0"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("esa analysis: error: device 0's audit log is broken: ")


@needs_corpus
def test_a_round_asking_more_than_the_devices_allow_is_refused_by_each_with_its_reason(tmp_path):
    # The devices ship with DeviceConfig(): at most epsilon_local 6 per query. The plan asks 7.
    plan = {**SMALL_PLAN, "devices": 40, "rounds": [{"epsilon_local": 7.0, "keep": 0}]}
    code, output = _run(tmp_path, plan, device_config={})
    result = json.loads((output / "analysis.json").read_text())
    (only,) = result["rounds"]
    assert result["device_config"]["local_epsilon_allowed"] == 6.0
    assert only["devices"]["refused_checks"] == 40 and only["stopped"] == "no device answered"
    assert only["devices"]["refusal_reasons"]["field_epsilon_local_exceeded"] == 40
    assert result["composition"]["central"]["epsilon"] == 0.0 and code == 0


@needs_corpus
def test_output_that_is_not_an_earlier_analysis_is_never_replaced(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**SMALL_PLAN, "devices": 5}))
    a_file = tmp_path / "file"
    a_file.write_text("keep")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep")
    for output, says in ((a_file, "is not a directory"), (folder, "something other than")):
        argv = ["analysis", "run", "--plan", str(plan), "--output", str(output), "--overwrite"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and says in err
    assert a_file.read_text() == "keep" and (folder / "precious.txt").read_text() == "keep"
