"""The evidence the docs cite is in the tree: every ``docs/gpu/...`` or ``docs/cpu/...`` path named by the
README, the docs, the kernels' docstrings or the benchmark scripts exists (a ``git show SHA:path`` names
history on purpose and is skipped), and ``docs/benchmarks.json`` (and the H100's ``benchmarks_h100.json``) merge only files that exist."""

import json
import re
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("name", ["benchmarks.json", "benchmarks_h100.json"])
def test_the_merged_benchmarks_name_files_in_the_tree(name):
    merged = json.loads((ROOT / "docs" / name).read_text())
    assert merged["merged_from"] and merged["results"]
    assert [p for p in merged["merged_from"] if not (ROOT / p).is_file()] == []
    assert {r["source"] for r in merged["results"]} <= set(merged["merged_from"])


def test_the_quoted_benchmark_tables_are_what_bench_table_prints():
    """README and docs/benchmarks.md quote bench_table.py's output for the commits they name: each
    ``bench_table.py --commits ...`` they mention prints a table that stands in them verbatim."""
    import subprocess
    import sys

    checked = 0
    for doc in (ROOT / "README.md", ROOT / "docs" / "benchmarks.md"):
        text = doc.read_text()
        for file, commits in set(re.findall(r"bench_table\.py(?: (docs/[\w.]+\.json))? --commits "
                                            r"([0-9a-f]{7}(?:,[0-9a-f]{7})*)", text)):
            p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_table.py"), *([file] if file else []),
                                "--commits", commits], capture_output=True, text=True, cwd=ROOT)
            assert p.returncode == 0, p.stderr
            assert p.stdout.strip() in text, f"{doc.name}: the tables of --commits {commits} differ from the file's"
            checked += 1
    assert checked >= 2, checked   # the H200's current tables (docs/benchmarks.md) and the H100's
