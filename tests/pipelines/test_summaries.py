"""``esa simulate``, ``esa shuffle`` and ``esa keys generate`` end with a short human summary;
``--json`` prints the machine form (simulation.json, metrics.json, the key paths)."""

from __future__ import annotations

import json
import os

import pytest

from pipelines.commandline.main import main

FAST = "--runner=FnApiRunner"


def test_keys_generate_says_which_file_goes_where(tmp_path, capsys):
    assert main(["keys", "generate", "--output", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("analyzer sealing key pair written")
    assert "--public-key" in out and "--key-ring" in out
    assert main(["keys", "generate", "--output", str(tmp_path / "b"), "--json"]) == 0
    paths = json.loads(capsys.readouterr().out)
    assert sorted(os.path.basename(p).split(".", 1)[1] for p in paths) == [
        "private.json", "public.json",
    ]  # fmt: skip
    assert (
        main(["keys", "generate", "--output", str(tmp_path / "c"), "--shuffler-instance", "1"]) == 0
    )
    assert "esa shuffle --instance 1 --signing-key" in capsys.readouterr().out


@pytest.mark.slow
def test_simulate_and_shuffle_summaries(tmp_path, capsys):
    sim = tmp_path / "sim"
    flags = ["--recipe", "small_binary_rr", "--respondents", "300", "--seed", "2", FAST]
    flags += ["--population", "zipf,crowds=2,crowd_exponent=0"]
    assert main(["simulate", "--output", str(sim), *flags]) == 0
    out = capsys.readouterr().out
    assert out.startswith("simulated 300 respondents of small_binary_rr@1")
    assert "2 natural crowds of 150 to 150 respondents" in out
    assert main(["simulate", "--output", str(sim), "--overwrite", "--json", *flags]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["crowds"] == {"crowd-0": 150, "crowd-1": 150}
    shuffled = tmp_path / "shuffled"
    argv = ["shuffle", "--input", f"{sim}/instance=0/*.avro", "--instance", "0"]
    argv += ["--output", str(shuffled), "--crowd-threshold", "10", FAST]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("shuffler instance 0: released")
    assert "read " in out and "(adds up)" in out
