"""The docs site builds (mkdocs --strict), reads as documentation rather than a lab notebook,
and links only inside the repository (or to the web)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs._helpers import ROOT


def user_docs() -> list[Path]:
    """The Markdown a user reads: README, the site's pages, the examples', integrations' and
    benchmarks' READMEs."""
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
             *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "examples").rglob("README.md")),
             *sorted((ROOT / "integrations").rglob("README.md"))]  # fmt: skip
    return [f for f in files if f.is_file()]


_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
             "twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|"
             "nineteenth|twentieth|\\d+(?:st|nd|rd|th)")

# What a work log says and documentation does not. Only phrases, never a bare "session":
# "MLflow session", "tool session", `session_id` are the product's words.
NOTEBOOK = {
    "work session": re.compile(
        rf"\b(?:{_ORDINALS}|this|last|previous|next|earlier|later)(?:\s+work)?\s+sessions?\b"
        r"|\bwork(?:ing)?\s+sessions?\b"
        r"|\bsessions?\s+\d+(?:\s*[-–]\s*\d+)?\b(?!\s*(?:s|ms|seconds?)\b)",
        re.IGNORECASE,
    ),
    "issue reference": re.compile(r"\b(?:issues?|PR|pull request|bug)\s+#?\d+\b", re.I),
    "this work": re.compile(r"\bthis work\b(?!\s*\?)", re.IGNORECASE),
    "quiet machine": re.compile(r"\bquiet(?:er)?\s+machine\b", re.IGNORECASE),
}
# Outside code blocks: "#12" (a GitHub issue) and a commit hash (7-40 hex digits, at least
# one digit and one letter, not part of a longer id such as a UUID or a trace id).
PROSE = {
    "issue number": re.compile(r"(?<![\w&/#])#\d{1,5}\b"),
    "commit hash": re.compile(
        r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])"
    ),
}

_FENCE = re.compile(r"^\s*(```|~~~)")


def _lines(path: Path):
    """(line number, text, inside a fenced code block) of ``path``."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def notebook_phrases(path: Path) -> list[str]:
    """``file:line: kind: "match"`` for each lab-notebook phrase in ``path``."""
    found = []
    for number, line, fenced in _lines(path):
        checks = dict(NOTEBOOK) if fenced else {**NOTEBOOK, **PROSE}
        for kind, pattern in checks.items():
            for match in pattern.finditer(line):
                found.append(f"{_shown(path)}:{number}: {kind}: {match.group(0)!r}")
    return found


_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_WEB = ("http://", "https://", "mailto:")


def bad_links(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: target (why)`` for each link or image in ``path`` that leaves the
    repository (``root``): an absolute or ``file://`` path, a relative one resolving outside
    it, or one to a file that does not exist."""
    found = []
    for number, line, fenced in _lines(path):
        if fenced:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        targets = [*_LINK.findall(prose), *_HTML.findall(prose), *_REF_LINK.findall(prose)]
        for target in targets:
            why = _leaves_repo(path, target, root)
            if why:
                found.append(f"{_shown(path)}:{number}: {target} ({why})")
    return found


def _leaves_repo(path: Path, target: str, root: Path) -> str | None:
    if target.startswith(_WEB) or target.startswith("#"):
        return None
    if target.startswith("file:") or "/work/" in target or target.startswith(("/", "~")):
        return "an absolute path"
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return "not a web link"
    file = target.split("#", 1)[0].split("?", 1)[0]
    resolved = (path.parent / file).resolve()
    if not resolved.is_relative_to(root.resolve()):
        return "outside the repository"
    if not resolved.exists():
        return "no such file in the repository"
    return None


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_reads_as_documentation_not_a_lab_notebook(path):
    found = notebook_phrases(path)
    assert not found, "lab-notebook phrasing:\n" + "\n".join(found)


@pytest.mark.parametrize("path", user_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_stay_inside_the_repository(path):
    found = bad_links(path)
    assert not found, "links that leave the repository:\n" + "\n".join(found)


def _probe(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "docs" / "probe.md"
    page.parent.mkdir(exist_ok=True)
    page.write_text(f"# Probe\n\n{text}\n", encoding="utf-8")
    return page


@pytest.mark.parametrize(("text", "kind"), [
    ("Fixed in the tenth session.", "work session"),
    ("The first session of the gateway serves rollouts.", "work session"),
    ("As measured this session, the step takes 3 s.", "work session"),
    ("The reroute (session 12) held.", "work session"),
    ("See issue 15 for the cause.", "issue reference"),
    ("The fix for #42 landed.", "issue number"),
    ("Reverted in `4c3b203`.", "commit hash"),
    ("Measured on a quiet machine.", "quiet machine"),
    ("Before this work the sync took 2 s.", "this work"),
])  # fmt: skip
def test_the_notebook_check_catches_each_kind(tmp_path, text, kind):
    found = notebook_phrases(_probe(tmp_path, text))
    assert any(f": {kind}: " in f for f in found), found


@pytest.mark.parametrize("text", [
    "Each rollout opens an MLflow session; pass `session_id` to resume it.",
    "The tool session of a rollout is released when it ends, like sessions of the gateway.",
    "A request waits up to 30 s; see [the guide](#timeouts) and color `#1f77b4`.",
    "Trace ids look like `tr-3f1c2a9b8e7d6c5b4a39281706f5e4d3`; a run is `0123abcd-ef45-6789`.",
    "Does this work? The facade decades `defaced` (words of hex letters) and 1234567 tokens.",
    "```\n# 1 comment, #2 in code, abc1234 in a block\n```",
])  # fmt: skip
def test_the_notebook_check_leaves_ordinary_text_alone(tmp_path, text):
    assert not notebook_phrases(_probe(tmp_path, text))


def test_the_link_check_refuses_paths_out_of_the_repository(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    page = _probe(tmp_path, "[a](../../shared/notes.md) ![b](/work/main/x.png) "
                  "[c](file:///etc) [ok](index.md#top) [web](https://example.com/x) "
                  "[missing](nope.md) `[code](../../x.md)`")
    found = bad_links(page, root=tmp_path)
    assert [f.split(": ", 1)[1].split(" ")[0] for f in found] == [
        "../../shared/notes.md", "/work/main/x.png", "file:///etc", "nope.md"]


def test_the_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("AGENTRL_REQUIRE_DOCS"):
            pytest.fail("mkdocs is not installed and AGENTRL_REQUIRE_DOCS is set: "
                        "pip install -e '.[docs]'")
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; "
                    "AGENTRL_REQUIRE_DOCS=1 makes this a failure)")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    problems = [line for line in build.stderr.splitlines()
                if line.startswith(("WARNING", "ERROR"))]
    assert build.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(
        problems or build.stderr.splitlines()[-20:])
