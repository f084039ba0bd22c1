"""No test replaces an engine function: tests hand the engine their fakes (a ``Parts`` that
returns them, a task's ``parts``, an entry point's ``deliver``), so what they prove is the code
that runs. The scan is the one ``benchmarks/structure.py`` reports."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_structure():
    spec = importlib.util.spec_from_file_location("tidegate_structure", ROOT / "benchmarks" / "structure.py")
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    return structure


def test_no_test_patches_a_tidegate_module():
    structure = load_structure()
    assert structure.patches_of_engine(ROOT / "tests") == []


def test_the_scan_finds_a_patch(tmp_path):
    structure = load_structure()
    patch = "monkeypatch" + ".setattr"  # kept out of this file's own text, which the scan reads
    (tmp_path / "test_x.py").write_text(
        "from tidegate import runner\nimport tidegate.guards as g\nimport tidegate_airflow.metrics as m\n\n"
        "def test_x(monkeypatch):\n"
        f"    {patch}(runner, 'release', None)\n"
        f"    {patch}(g, 'preflight', None)\n"
        f"    {patch}('tidegate.runner.release', None)\n"
        f"    {patch}(m, 'emit_state', None)\n")
    found = structure.patches_of_engine(tmp_path)
    assert [f.split(" ", 1)[0].rsplit(":", 1)[1] for f in found] == ["6", "7", "8"]
