"""Shared fixtures: real servers from scripts/services, handed to tests as connections.

Each service fixture brings its server up through the same script a developer uses
(idempotent: a running server is reused) and fails the test, naming the service, when the
server cannot be had. No test skips for a missing server.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ROOT / "scripts" / "services"
# `make test` runs two pytest-xdist workers, a test module at a time each. The second worker (gw1)
# gets servers of its own, a lane of scripts/services (its own data folder, every port 200 up),
# so that a test that kills, stops or restarts a server never hits the other worker's tests.
# Under a lane of its own (TIDEGATE_LANE=N, a second checkout's tests beside `make test`), the
# workers take lanes N, N+1, ...: never lane 1 of the checkout whose `make test` runs beside it.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
if _WORKER.isdigit() and int(_WORKER) > 0:
    _BASE_LANE = int(os.environ.get("TIDEGATE_LANE") or 0)
    os.environ["TIDEGATE_LANE"] = str(_BASE_LANE + int(_WORKER))
    _DIR = os.environ.get("TIDEGATE_SERVICES_DIR")
    if _BASE_LANE and _DIR:  # exported by `services env` of lane N: lane N's folder, not the base
        os.environ["TIDEGATE_SERVICES_DIR"] = _DIR.removesuffix(f"-lane{_BASE_LANE}")
sys.path.insert(0, str(ROOT / "include"))

from tidegate.connections import Connection, get_connection  # noqa: E402


def services_cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(SERVICES), *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        pytest.fail(f"scripts/services {' '.join(args)} failed:\n{r.stderr[-2000:]}", pytrace=False)
    return r


def services_env() -> dict[str, str]:
    """The `export K='V'` lines of `scripts/services env` as a dict."""
    out = services_cmd("env").stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    return env


@pytest.fixture(scope="session")
def service_env() -> dict[str, str]:
    env = services_env()
    os.environ.update(env)
    return env


@dataclass(frozen=True)
class Service:
    name: str
    cdc: Connection | None
    admin: Connection | None = None

    @property
    def port(self) -> int:
        return (self.cdc or self.admin).port

    # PostgreSQL: libpq DSNs
    @property
    def admin_dsn(self) -> str:
        return _dsn(self.admin)

    @property
    def cdc_dsn(self) -> str:
        return _dsn(self.cdc)

    # MariaDB: pymysql keyword arguments
    def mysql_kwargs(self, admin: bool = True, **kw) -> dict:
        c = self.admin if admin else self.cdc
        return dict(host=c.host, port=c.port, user=c.login, password=c.password,
                    database=c.schema, charset="utf8mb4", **kw)


def _dsn(c: Connection) -> str:
    return (f"host={c.host} port={c.port} dbname={c.schema} user={c.login} "
            f"password={c.password}")


def _bring_up(name: str, service_env: dict[str, str]) -> None:
    r = services_cmd("up", name, check=False)
    if r.returncode != 0:
        pytest.fail(f"service {name!r} is not available (scripts/services up {name}):\n"
                    f"{r.stderr[-2000:]}", pytrace=False)


def _service(name: str, cdc_id: str | None, admin_id: str | None, env: dict[str, str]) -> Service:
    _bring_up(name, env)
    return Service(
        name=name,
        cdc=get_connection(cdc_id, env) if cdc_id else None,
        admin=get_connection(admin_id, env) if admin_id else None,
    )


@pytest.fixture(scope="session")
def mysql(service_env) -> Service:
    return _service("mysql", "cdc_mysql", "cdc_mysql_admin", service_env)


@pytest.fixture(scope="session")
def mysql_replica(service_env, mysql) -> Service:
    svc = _service("mysql_replica", "cdc_mysql_replica", None, service_env)
    # Same admin login as the primary (users replicate), pointed at the replica's port.
    admin = mysql.admin
    return Service(svc.name, svc.cdc, Connection(**{**admin.__dict__, "conn_id": "replica_admin",
                                                     "port": svc.cdc.port}))


@pytest.fixture(scope="session")
def postgres(service_env) -> Service:
    return _service("postgres", "cdc_postgres", "cdc_postgres_admin", service_env)


@pytest.fixture(scope="session")
def postgres_standby(service_env, postgres) -> Service:
    svc = _service("postgres_standby", "cdc_postgres_standby", None, service_env)
    admin = postgres.admin
    return Service(svc.name, svc.cdc, Connection(**{**admin.__dict__, "conn_id": "standby_admin",
                                                     "port": svc.cdc.port}))


@pytest.fixture(scope="session")
def kafka(service_env) -> Service:
    return _service("kafka", "cdc_kafka", None, service_env)


@pytest.fixture(scope="session")
def redis_service(service_env) -> Service:
    return _service("redis", "cdc_redis", None, service_env)


@pytest.fixture(scope="session")
def nats_service(service_env) -> Service:
    return _service("nats", "cdc_nats", None, service_env)


@pytest.fixture()
def kafka_bootstrap(kafka) -> str:
    return kafka.cdc.extra["bootstrap.servers"]


@pytest.fixture()
def pg_scratch_dsn(postgres):
    """A libpq DSN of a fresh, empty database on the `postgres` server (dropped afterwards)."""
    import uuid

    import psycopg2
    from psycopg2.extensions import make_dsn, parse_dsn

    dbname = f"tidegate_scratch_{uuid.uuid4().hex[:8]}"

    def admin_sql(sql: str) -> None:
        # A connection per statement: a test may have restarted the server in between.
        admin = psycopg2.connect(postgres.admin_dsn)
        admin.autocommit = True
        try:
            with admin.cursor() as cur:
                cur.execute(sql)
        finally:
            admin.close()

    admin_sql(f'CREATE DATABASE "{dbname}"')
    params = {k: v for k, v in parse_dsn(postgres.admin_dsn).items() if k != "dbname"}
    yield make_dsn(**params, dbname=dbname)
    admin_sql(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
