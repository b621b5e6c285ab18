"""``esa analysis run`` end to end on a small fleet: rounds through simulate -> shuffle -> analyze,
refusals counted, budgets composed, and each device's audit log equal to what it sent."""

from __future__ import annotations

import glob
import hashlib
import json

import fastavro
import google_crc32c
import pytest

from pipelines.commandline.main import main
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
    # Two rounds of epsilon 5 fit; the third is refused by every device (Check 1).
    "analysis_epsilon": 10.0,
    "field_epsilon": 12.0,
    "local_epsilon_allowed": 6.0,
    "rounds": [
        {"epsilon_local": 5.0, "keep": 6},
        {"epsilon_local": 5.0, "keep": 4},
        {"epsilon_local": 5.0, "keep": 0},
    ],
    "baseline": False,
}


def _run(tmp_path, plan, name="out"):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))
    output = tmp_path / name
    code = main(["analysis", "run", "--plan", str(path), "--output", str(output),
                 "--runner=FnApiRunner"])  # fmt: skip
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
