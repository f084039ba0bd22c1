"""The zip Spark tasks import tidegate from (tidegate/spark/package.py) carries the compiled hot
path, and a process that has only the zip on its path loads it. Without it every run delivered
by a Spark task took the pure-Python path (a 1M-change run's delivery task: 24.9 s, against
10.8 s for `tidegate run`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tidegate.native import rowcodec
from tidegate.spark.package import package_zip

PROBE = """
import json, tidegate, tidegate.native as native
print(json.dumps({"tidegate": tidegate.__file__, "native": getattr(native.rowcodec, "__file__", None)}))
"""


def test_the_zip_carries_the_compiled_module_and_a_task_importing_from_it_loads_it(tmp_path):
    assert rowcodec is not None, "make native: the checkout's compiled module is not built"
    zipped = package_zip(tmp_path)
    names = zipfile.ZipFile(zipped).namelist()
    assert f"tidegate/native/{Path(rowcodec.__file__).name}" in names
    assert len(names) == len(set(names))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": str(zipped), "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    got = json.loads(out.stdout)
    assert got["tidegate"].startswith(str(zipped)), got  # the engine from the zip, not the checkout
    assert got["native"] and got["native"].startswith(str(tmp_path / "tidegate-native-")), got
