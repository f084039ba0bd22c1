"""Build tidegate's compiled hot path in place: include/tidegate/native/rowcodec*.so, from
native/rowcodec.pyx and the ``.pxi`` file of each role it includes (each beside its Python twin).

    .venv/bin/python scripts/build_native.py [--force]

Run by ``make install`` (target ``native``); skips the build when the module is newer than its
sources. Needs Cython (pinned in requirements.txt), a C compiler and the interpreter's headers
(Python.h) and OpenSSL's (the event ids' SHA-1, native/sha1.h); on Debian, as root, a missing
``gcc`` / ``python3-dev`` / ``libssl-dev`` is installed with apt. Where
the module is missing tidegate runs its pure-Python path (tidegate/native/__init__.py), which
gives the same bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "include" / "tidegate"
NATIVE = PACKAGE / "native"
OPENSSL_SHA_H = "/usr/include/openssl/sha.h"  # Debian's libssl-dev
SOURCES = [NATIVE / "rowcodec.pyx", *sorted(PACKAGE.rglob("*.pxi")), NATIVE / "sha1.h",
           Path(__file__).resolve()]


def up_to_date() -> bool:
    built = list(NATIVE.glob("rowcodec*.so"))
    return bool(built) and min(p.stat().st_mtime for p in built) > max(p.stat().st_mtime for p in SOURCES)


def ensure_toolchain() -> None:
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = [pkg for pkg, ok in (("gcc", shutil.which(os.environ.get("CC", "gcc"))),
                                   ("python3-dev", headers.exists()),
                                   ("libssl-dev", Path(OPENSSL_SHA_H).exists())) if not ok]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise SystemExit(f"building tidegate's compiled path needs {' and '.join(missing)} "
                         f"(Python.h looked for at {headers}); install them and run make install again")
    print(f"build_native: installing Debian packages {' '.join(missing)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def build() -> None:
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    ext = Extension("tidegate.native.rowcodec", [str(NATIVE / "rowcodec.pyx")],
                    include_dirs=[str(NATIVE)], extra_compile_args=["-O2"],
                    libraries=["crypto"])  # OpenSSL's SHA-1 (native/sha1.h)
    # The .pxi files are included by their path under the package (rowcodec.pyx's include lines).
    modules = cythonize([ext], quiet=True, language_level=3, include_path=[str(PACKAGE)],
                        build_dir=str(ROOT / "build" / "cython"))
    dist = Distribution({"ext_modules": modules})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(ROOT / "include")  # next to the sources: the editable install imports it there
    cmd.build_temp = str(ROOT / "build" / "temp")
    cmd.force = True
    os.chdir(ROOT)
    cmd.ensure_finalized()
    cmd.run()


def main() -> int:
    if "--force" not in sys.argv[1:] and up_to_date():
        print("build_native: include/tidegate/native/rowcodec is up to date")
        return 0
    ensure_toolchain()
    build()
    if not up_to_date():
        print("build_native: the build left no up-to-date rowcodec module", file=sys.stderr)
        return 1
    print("build_native: built include/tidegate/native/rowcodec")
    return 0


if __name__ == "__main__":
    sys.exit(main())
