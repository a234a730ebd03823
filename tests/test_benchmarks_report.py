"""The benchmark result files follow one format, and the generated page matches them."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _results, report

RESULT_FILES = sorted(report.RESULTS_DIR.glob("*.json"))


def test_there_are_result_files():
    assert len(RESULT_FILES) >= 10


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_result_file_follows_the_format(path: Path):
    payload = json.loads(path.read_text())
    assert report.contract_problems(payload) == []
    assert payload["benchmark"] == path.stem
    dt.datetime.fromisoformat(payload["date"])  # an ISO date, not 'not recorded'
    assert payload["command"].startswith("python benchmarks/")
    for figure in payload["figures"]:
        assert isinstance(figure["baseline"], str) and figure["baseline"], figure["name"]


def test_committed_pages_are_up_to_date():
    done = subprocess.run([sys.executable, str(report.BENCH_DIR / "report.py"), "--check"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_page(tmp_path, monkeypatch):
    stale = {"readme": tmp_path / "README.md", "docs": tmp_path / "benchmarks.md"}
    for path in stale.values():
        path.write_text("# Benchmarks\n")
    monkeypatch.setattr(report, "PAGES", stale)
    assert report.main(["--check"]) == 1
    assert report.main([]) == 0  # writes them
    assert report.main(["--check"]) == 0


def test_contract_problems_names_what_is_missing():
    payload = {"benchmark": "x", "machine": {"cpu": "c"}, "date": "2026-01-01",
               "figures": [{"name": "f", "value": 1}]}  # fmt: skip
    problems = report.contract_problems(payload)
    assert "no 'command'" in problems
    assert "'machine' needs cpu, cores and bf16" in problems
    assert any("'f' lacks unit, baseline, baseline_value, ratio" in p for p in problems)


def test_write_result_records_machine_date_command_and_merges(tmp_path, monkeypatch):
    monkeypatch.setattr(_results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(report.BENCH_DIR / "engine.py"), "--quick"])
    _results.write_result("engine", {
        "batching_speedup": {"value": 30.0, "baseline": 10.0, "ratio": 3.0, "goal": 5.0,
                             "unit": "tok/s"},
        "runs": {"value": None, "rounds": [1, 2]},
    })  # fmt: skip
    first = json.loads((tmp_path / "engine.json").read_text())
    assert report.contract_problems(first) == []
    assert first["command"] == "python benchmarks/engine.py --quick"
    assert first["machine"]["cores"] >= 1 and first["machine"]["bf16"].split()[0] in (
        "native", "emulated")
    (figure,) = first["figures"]
    assert figure["baseline"].startswith("HF generate")  # named from _results.BASELINES
    assert (figure["value"], figure["baseline_value"], figure["ratio"]) == (30.0, 10.0, 3.0)
    assert first["details"] == {"runs": {"value": None, "rounds": [1, 2]}}

    monkeypatch.setattr(sys, "argv", [str(report.BENCH_DIR / "engine.py"), "--other"])
    other_machine = {"cpu": "Other CPU", "cores": 4, "bf16": "native (AMX)"}
    monkeypatch.setattr(_results, "machine_info", lambda: other_machine)
    _results.write_result("engine", {"second": {"value": 2.0, "baseline": 1.0, "ratio": 2.0,
                                                "unit": "s", "baseline_name": "B"}},
                          merge=True)  # fmt: skip
    merged = json.loads((tmp_path / "engine.json").read_text())
    by_name = {f["name"]: f for f in merged["figures"]}
    assert by_name["batching_speedup"]["command"] == "python benchmarks/engine.py --quick"
    assert by_name["second"]["command"] == "python benchmarks/engine.py --other"
    assert by_name["second"]["baseline"] == "B"
    assert merged["details"] == first["details"]
    # Each figure keeps the machine it was measured on, and the page names the other one.
    assert by_name["batching_speedup"]["machine"] == first["machine"]
    assert merged["machine"] == by_name["second"]["machine"] == other_machine
    page = "\n".join(report.section(merged, lambda path: path))
    assert f"measured on {report._day(first['date'])} on " in page
    assert report.describe_machine(first["machine"]) in page


def test_an_older_file_is_shown_with_what_it_records():
    old = {"benchmark": "tree", "when": "2026-11-28T14:36:42+00:00",
           "machine": {"cpu_count": 2},
           "figures": {"generated_tokens": {"value": 0.5, "baseline": 2000.0, "after": 1000.0,
                                            "goal": 0.6, "unit": "tokens, tree / chain"},
                       "runs": {"value": None, "chain": []}}}  # fmt: skip
    new = _results.normalise(old, "tree")
    assert new["date"] == old["when"] and new["command"] == _results.NOT_RECORDED
    (figure,) = new["figures"]
    # the ratio was the value; the tree's own measurement was 'after'
    assert (figure["value"], figure["baseline_value"], figure["ratio"]) == (1000.0, 2000.0, 0.5)
    assert new["details"] == {"runs": {"value": None, "chain": []}}
    page = report.render([new | {"machine": {"cores": 2}}], target="docs")
    assert "CPU model not recorded" in page and "Command: not recorded" in page
    assert "](" not in page.split("## tree", 1)[1]  # the docs page links nothing outside docs/


def test_readme_links_scripts_and_results_beside_it():
    page = report.PAGES["readme"].read_text()
    assert "[`benchmarks/engine.py`](engine.py)" in page
    assert "(results/engine.json)" in page


def _environments(tasks: dict, figures: list) -> list[dict]:
    machine = {"cpu": "CPU", "cores": 2, "bf16": "native", "torch": "2.13.0+cpu"}
    return [{"benchmark": "environments", "machine": machine, "date": "2026-12-01T00:00:00",
             "command": "python benchmarks/environments.py", "figures": figures,
             "details": {"tasks": tasks}}]  # fmt: skip


def test_the_guides_table_lists_each_task_and_the_trl_side():
    entry = {"heldout_before": 20.0, "heldout_after": 37.5, "heldout_gain": 17.5, "steps": 96,
             "minutes": 6.0, "generated_tokens": 1234}
    trl = {"heldout_before": 20.0, "heldout_after": 25.0, "steps": 10, "minutes": 6.5}
    figures = [{"name": "vs_trl_gain_per_minute", "value": 2.9, "baseline_value": 0.8,
                "task": "chain_sum", "trl": trl},
               {"name": "vs_trl_seconds_per_update", "value": 3.5, "baseline_value": 35.0,
                "ratio": 10.0}]
    table = report.environment_table(_environments({"products": entry, "chain_sum": entry},
                                                   figures), "tasks")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `chain_sum` | 20 | 37.5 | **17.5** | 96 | 6 | 1,234 |")
    assert rows[1].startswith("| `products` ")
    assert "20 → 25 in 10 updates" in table and "(10x)" in table
    games = report.environment_table(_environments({"chain_sum": entry}, []), "games")
    assert games.startswith("No run of this kind is recorded")
