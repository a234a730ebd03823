"""Run README.md's Quickstart section exactly as written, in a fresh folder.

Its fenced blocks are taken in order: a block with a ``title="NAME"`` is written to the file
NAME, a ``bash`` block is run line by line (``bash -e``) with ``--bin``'s folder first on PATH,
so the same text is checked against a development checkout and against an installed wheel.

    python scripts/readme_quickstart.py --bin .venv/bin --dir /tmp/quickstart
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.M | re.S)


@dataclass(frozen=True)
class Block:
    """One fenced block of the section: its language, the file it names, its text."""

    language: str
    title: str | None
    text: str


def quickstart_blocks(readme: Path = README) -> list[Block]:
    """The fenced blocks of the ``## Quickstart`` section, in order."""
    text = readme.read_text(encoding="utf-8")
    start = text.index("\n## Quickstart\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else None]
    return [Block(lang, title or None, body) for lang, title, body in _FENCE.findall(section)]


def run_quickstart(folder: Path, bin_dir: Path, timeout_s: float = 900) -> str:
    """Write and run the blocks in ``folder``; returns what the commands printed.

    Raises ``subprocess.CalledProcessError`` (with the output) when a command fails.
    """
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir.resolve()}{os.pathsep}{os.environ.get('PATH', '')}"}
    printed = []
    for block in quickstart_blocks():
        if block.title is not None:
            (folder / block.title).write_text(block.text, encoding="utf-8")
        elif block.language == "bash":
            done = subprocess.run(["bash", "-e", "-c", block.text], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
            printed.append(done.stdout + done.stderr)
            done.check_returncode()
    return "".join(printed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, default=Path(sys.executable).parent,
                        help="Folder holding the python and agentrl to run (a venv's bin).")
    parser.add_argument("--dir", type=Path, required=True, help="Folder to run in (new).")
    args = parser.parse_args()
    try:
        print(run_quickstart(args.dir, args.bin))
    except subprocess.CalledProcessError as exc:
        print(exc.stdout, exc.stderr, sep="\n", file=sys.stderr)
        raise SystemExit(f"the README quickstart failed: {exc.cmd[-1]!r} exited {exc.returncode}")


if __name__ == "__main__":
    main()
