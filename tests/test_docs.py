"""The evidence the docs cite is in the tree: every ``docs/gpu/...`` or ``docs/cpu/...`` path named by the
README, the docs, the kernels' docstrings or the benchmark scripts exists (a ``git show SHA:path`` names
history on purpose and is skipped), and ``docs/benchmarks.json`` merges only files that exist."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"(?<![:\w/])(docs/(?:gpu|cpu)/[\w./*-]+?)(?=[`'\"),;:\s]|\.\s|$)")


def _sources():
    yield from (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "gpu" / "README.md")
    for folder in ("kernels", "benchmarks", "kdadbg"):
        yield from sorted((ROOT / folder).rglob("*.py"))


def test_every_cited_evidence_path_exists():
    cited, missing = 0, []
    for src in _sources():
        for line in src.read_text().splitlines():
            for path in CITED.findall(line):
                cited += 1
                path = path.rstrip(".")
                if not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                    missing.append(f"{src.relative_to(ROOT)}: {path}")
    assert cited > 20, cited
    assert not missing, "\n".join(missing)


def test_the_merged_benchmarks_name_files_in_the_tree():
    merged = json.loads((ROOT / "docs" / "benchmarks.json").read_text())
    assert merged["merged_from"] and merged["results"]
    assert [p for p in merged["merged_from"] if not (ROOT / p).is_file()] == []
    assert {r["source"] for r in merged["results"]} <= set(merged["merged_from"])
