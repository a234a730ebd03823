"""Turn GSM8K-format records into verl-format rows for the GSM8K tool agent.

    python -m examples.data.make_gsm8k_tool_data INPUT.jsonl|.parquet OUTPUT.parquet
    python -m examples.data.make_gsm8k_tool_data --write-sample sample.jsonl --count 200

GSM8K records have ``question`` and ``answer`` (worked solution ending in ``#### N``). Nothing
is downloaded: point INPUT at your local copy of GSM8K (e.g. ``train.jsonl``), or write the
small GSM8K-format sample this project generates (one-step word problems) for tests and the
CPU demo. Each output row is what verl's ``gsm8k_multiturn_w_tool`` preprocessing writes:
``prompt``, ``data_source``, ``agent_name``, ``ability``, ``reward_model.ground_truth`` and
``extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import typer

SYSTEM = (
    "You are a math agent. Compute with the calculator tool, submit your answer with "
    "calc_gsm8k_reward, then reply with '#### ' and the number."
)
AGENT_NAME = "gsm8k_tool_agent"
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])


def extract_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K solution, without thousands separators.

    Raises:
        ValueError: The solution has no ``#### N`` line.
    """
    match = _FINAL.search(solution)
    if match is None:
        raise ValueError(f"no '#### N' final answer in {solution[-80:]!r}")
    return match.group(1).replace(",", "")


def to_verl_row(record: dict[str, Any], index: int, split: str = "train") -> dict[str, Any]:
    """One GSM8K record as a verl-format row for the tool agent."""
    answer = extract_answer(record["answer"])
    return {
        "data_source": "openai/gsm8k",
        "agent_name": AGENT_NAME,
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": record["question"]},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "question": record["question"],
            "answer": record["answer"],
            "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": answer}}},
        },
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    """GSM8K records from a local ``.jsonl`` or ``.parquet`` file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# One-step word problems in GSM8K's format: (question, operator) templates.
_TEMPLATES = [
    ("{name} has {a} apples. {pron} buys {b} more. How many apples does {name} have now?", "+"),
    ("{name} has {a} stickers and finds {b} more. How many stickers does {name} have?", "+"),
    ("{name} has {a} cookies. {pron} eats {b} of them. How many cookies are left?", "-"),
    ("{name} had {a} marbles and gave {b} away. How many marbles does {name} have left?", "-"),
    ("{name} has {a} boxes with {b} pens in each box. How many pens does {name} have?", "*"),
    ("{name} buys {a} packs of {b} cards. How many cards did {name} buy?", "*"),
]
_NAMES = [("Tom", "He"), ("Ana", "She"), ("Sam", "He"), ("Mia", "She"), ("Lee", "He")]


def sample_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """GSM8K-format records (``<<a+b=c>>`` annotations and ``#### c``) with one-digit operands."""
    rng = random.Random(seed)
    records = []
    for _ in range(count):
        template, op = rng.choice(_TEMPLATES)
        name, pron = rng.choice(_NAMES)
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        if op == "-":
            a, b = max(a, b), min(a, b)
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        records.append({
            "question": template.format(name=name, pron=pron, a=a, b=b),
            "answer": f"{name} ends up with {a} {op} {b} = <<{a}{op}{b}={result}>>{result}.\n"
                      f"#### {result}",
        })
    return records


def write_sample(path: Path, count: int = 200, seed: int = 0) -> Path:
    """Write ``count`` generated GSM8K-format records to ``path`` (JSONL)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in sample_records(count, seed)))
    return path


def convert(source: Path, target: Path, split: str = "train") -> int:
    """Convert a GSM8K file to verl-format parquet; returns the number of rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [to_verl_row(r, i, split) for i, r in enumerate(read_records(source))]
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), target)
    return len(rows)


@app.command()
def main(
    source: Path = typer.Argument(None, help="Local GSM8K .jsonl/.parquet to convert."),
    target: Path = typer.Argument(None, help="Output .parquet."),
    split: str = typer.Option("train", help="Recorded in extra_info.split."),
    write_sample_to: Path = typer.Option(None, "--write-sample",
                                         help="Write a generated GSM8K-format sample here."),
    count: int = typer.Option(200, help="Records in the generated sample."),
) -> None:
    """Convert GSM8K records to verl-format rows, or write the generated sample."""
    if write_sample_to is not None:
        typer.echo(f"wrote {count} records to {write_sample(write_sample_to, count)}")
    if source is not None:
        if target is None:
            raise typer.BadParameter("give the output .parquet path after the input")
        typer.echo(f"wrote {convert(source, target, split)} rows to {target}")


if __name__ == "__main__":
    app()
