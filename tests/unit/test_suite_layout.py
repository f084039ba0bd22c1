"""The test suite itself: pytest imports test modules by their file name (the test folders are
not packages), so two test files of one name stop a full run at collection."""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_no_two_test_modules_share_a_file_name():
    places = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        places[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: sorted(paths) for name, paths in places.items() if len(paths) > 1}
    assert shared == {}, f"rename one of each: {shared}"
