"""The project's servers for the benchmark scripts: ``scripts/services`` called as a program, and
the environment it gives (connection URIs, ports). Run from benchmarks/, the scripts import it as
a sibling module."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[1] / "scripts" / "services"


def services(*args: str, env: dict | None = None) -> str:
    r = subprocess.run([sys.executable, str(SERVICES), *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"scripts/services {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def services_env() -> dict[str, str]:
    """``scripts/services env``'s variables (its ``export K=V`` lines)."""
    out = {}
    for line in services("env").splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        out[key] = shlex.split(value)[0]
    return out


def admin_connection(source: str, env: dict | None = None):
    """An autocommit connection of the source's admin login (``cdc_mysql_admin`` or
    ``cdc_postgres_admin``): what a benchmark's workload writes with."""
    from tidegate.connections import get_connection

    admin = get_connection(f"cdc_{source}_admin", env)
    if source == "mysql":
        import pymysql

        return pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                               autocommit=True)
    import psycopg2

    conn = psycopg2.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                            dbname=admin.schema)
    conn.autocommit = True
    return conn


def bench_table(source: str, env: dict, name: str, server_id: int) -> str:
    """A database (MariaDB) or schema (PostgreSQL) ``name`` with one table ``t`` (id, v, s
    VARCHAR(40)) the CDC login may read; returns the spec's source line for it, placed at the head
    (PostgreSQL: the first run creates the slot ``name``)."""
    from tidegate.connections import get_connection

    conn = admin_connection(source, env)
    with conn.cursor() as c:
        c.execute(f"CREATE {'DATABASE' if source == 'mysql' else 'SCHEMA'} {name}")
        c.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v INT, s VARCHAR(40))")
        if source == "postgres":
            cdc = get_connection("cdc_postgres", env)
            c.execute(f"GRANT USAGE ON SCHEMA {name} TO {cdc.login}")
            c.execute(f"GRANT SELECT ON {name}.t TO {cdc.login}")
    conn.close()
    if source == "mysql":
        return f"{{kind: mysql, conn_id: cdc_mysql, tables: [{name}.t], server_id: {server_id}, start: head}}"
    return f"{{kind: postgres, conn_id: cdc_postgres, tables: [{name}.t], slot: {name}, start: head}}"
