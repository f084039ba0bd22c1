"""docker-compose.yaml, checked without a Docker engine: the whole stack is there, every image
is pinned, every service has a health check, and the servers run with the settings tidegate
needs, the same as scripts/services gives the test and demo servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "spark-master", "spark-worker",
            "mariadb", "postgres", "kafka", "redis", "nats")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


@pytest.fixture(scope="module")
def services_script() -> str:
    return (ROOT / "scripts" / "services").read_text()


def command(svc: dict) -> str:
    c = svc.get("command") or ""
    return " ".join(c) if isinstance(c, list) else c


def test_the_whole_stack_is_there(compose):
    assert set(SERVICES) <= set(compose["services"])


def test_every_service_has_a_healthcheck(compose):
    for name, svc in compose["services"].items():
        check = svc.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name}: no healthcheck"


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest") and any(ch.isdigit() for ch in tag)


def test_every_image_is_pinned(compose):
    for name, svc in compose["services"].items():
        assert svc.get("image"), f"{name}: no image (a built service names its image too)"
        assert _pinned(svc["image"]), f"{name}: image {svc['image']!r} is not pinned to a version"
    froms = []
    for dockerfile in (ROOT / "Dockerfile", ROOT / "docker" / "postgres.Dockerfile"):
        froms += re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.M)
    assert froms and all(_pinned(f) for f in froms), froms


def test_airflow_runs_this_project_with_the_local_executor(compose):
    svcs = compose["services"]
    assert svcs["airflow-scheduler"]["build"] == "."
    assert "airflow scheduler" in command(svcs["airflow-scheduler"])
    assert "airflow dag-processor" in command(svcs["airflow-dag-processor"])
    assert "airflow api-server" in command(svcs["airflow-apiserver"])
    env = svcs["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert "@postgres:5432/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert "spark://spark-master" in env["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert svcs["airflow-scheduler"]["hostname"] == "airflow-scheduler"  # executors reach the driver
    assert svcs["airflow-apiserver"]["ports"] == ["127.0.0.1:8080:8080"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM apache/airflow:" in dockerfile
    assert "pip install --no-cache-dir --no-deps -e /opt/tidegate" in dockerfile
    assert "openjdk-17-jre-headless" in dockerfile  # spark-submit needs Java


def test_mariadb_binlog_settings_match_scripts_services(compose, services_script):
    cmd = command(compose["services"]["mariadb"])
    for flag in ("--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
                 "--gtid-strict-mode=ON", "--log-slave-updates=ON", "--server-id=1"):
        assert flag in cmd, f"mariadb: {flag} missing"
        assert flag.split("=")[0] in services_script  # the test servers use it too
    assert "--log-bin=" in cmd


def test_postgres_logical_decoding_with_wal2json(compose, services_script):
    cmd = command(compose["services"]["postgres"])
    assert "wal_level=logical" in cmd and "wal_level = logical" in services_script
    assert "postgresql-15-wal2json" in (ROOT / "docker" / "postgres.Dockerfile").read_text()


def test_kafka_kraft_with_single_node_transaction_settings(compose, services_script):
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    expected = {"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":
                "transaction.state.log.replication.factor=1",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "transaction.state.log.min.isr=1",
                "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "offsets.topic.replication.factor=1"}
    for var, prop in expected.items():
        assert env[var] == "1" and prop in services_script
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "auto.create.topics.enable=false" in services_script


def test_nats_jetstream_and_redis_aof(compose, services_script):
    assert "jetstream" in (ROOT / "docker" / "nats.conf").read_text()
    assert "/etc/nats/tidegate.conf" in command(compose["services"]["nats"])
    redis_cmd = command(compose["services"]["redis"])
    assert "--appendonly yes" in redis_cmd and "--appendfsync always" in redis_cmd
    assert "appendonly yes" in services_script and "appendfsync always" in services_script


def test_no_secret_is_written_into_the_file(compose):
    """Secrets come from .env (``${VAR:?...}`` fails with the variable's name when unset)."""
    for name, svc in compose["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            value = str(value)
            if any(w in key for w in ("PASSWORD", "SECRET", "FERNET")) and not key.endswith("_FILE"):
                assert value.startswith("${") and ":?" in value, f"{name}: {key} is not from .env"
            for userinfo in re.findall(r"://[^/@\s]+:([^@\s]+)@", value):
                assert userinfo.startswith("${"), f"{name}: {key} has a literal password"


# --------------------------------------------------------------------------- does it start

# What the images run, from their own Dockerfiles and entrypoint scripts (no Docker engine here
# to look). The Airflow image's /entrypoint runs `airflow ...`, `bash ...` and `python ...` and
# turns any other command into `airflow <command>`; the servers' entrypoints run their server
# when the command starts with an option.
AIRFLOW_ENTRYPOINT_RUNS = ("airflow", "bash", "python")
SERVER_ENTRYPOINT_RUNS = {"mariadb": ("-", "mariadbd"), "tidegate-postgres": ("-", "postgres"),
                          "redis": ("-", "redis-server", "sh"), "nats": ("-", "nats-server")}
# Executables each image provides (the tidegate image: the Airflow image's, pyspark's launchers
# from the pinned pyspark, Java from the Dockerfile).
EXECUTABLES = {
    "tidegate": {"airflow", "bash", "python", "python3", "curl", "spark-class", "spark-submit", "java"},
    "mariadb": {"healthcheck.sh", "mariadb", "mariadbd", "bash"},
    "tidegate-postgres": {"pg_isready", "psql", "postgres", "bash"},
    "apache/kafka": {"/opt/kafka/bin/kafka-broker-api-versions.sh", "/opt/kafka/bin/kafka-topics.sh", "sh"},
    "redis": {"redis-cli", "redis-server", "sh"},
    "nats": {"wget", "nats-server", "sh"},
}
# Variables an image's entrypoint sets before running init scripts (postgres: POSTGRES_USER
# defaults to "postgres" and is exported).
IMAGE_VARIABLES = {"tidegate-postgres": {"POSTGRES_USER"}}


def image_of(svc: dict) -> str:
    return svc["image"].rpartition(":")[0]


def words(value) -> list[str]:
    return list(value) if isinstance(value, list) else str(value or "").split()


def test_every_command_is_run_by_an_entrypoint_that_can_run_it(compose):
    for name, svc in compose["services"].items():
        image, cmd = image_of(svc), words(svc.get("command"))
        if svc.get("entrypoint"):
            entry = words(svc["entrypoint"])[0]
            assert entry in EXECUTABLES[image], f"{name}: entrypoint {entry!r} is not in its image"
        elif image == "tidegate":
            assert cmd and cmd[0] in AIRFLOW_ENTRYPOINT_RUNS, (
                f"{name}: the Airflow image's entrypoint would run `airflow {' '.join(cmd)}`: give the "
                f"service an entrypoint of its own")
        elif cmd:
            assert cmd[0].startswith(SERVER_ENTRYPOINT_RUNS[image]), f"{name}: {cmd[0]!r}"


def test_the_tidegate_image_has_the_executables_the_stack_counts_on():
    import pyspark

    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pyspark" in dockerfile and "openjdk-17-jre-headless" in dockerfile
    launchers = Path(pyspark.__file__).parent / "bin"  # what `pip install pyspark` puts on PATH
    assert (launchers / "spark-class").is_file() and (launchers / "spark-submit").is_file()
    assert "FROM apache/airflow:" in dockerfile  # python3, bash and curl are the Airflow image's


def _healthcheck_executable(svc: dict) -> str:
    test = svc["healthcheck"]["test"]
    if isinstance(test, str):
        return test.split()[0]
    return test[1].split()[0] if test[0] == "CMD-SHELL" else test[1]


def test_every_service_waited_on_has_a_healthcheck_its_image_can_run(compose):
    svcs = compose["services"]
    waited = {target for svc in svcs.values() for target in (svc.get("depends_on") or {})}
    assert waited, "no service waits on another"
    for name in sorted(svcs):
        exe = _healthcheck_executable(svcs[name])
        assert exe in EXECUTABLES[image_of(svcs[name])], f"{name}: healthcheck runs {exe!r}"
    for svc in svcs.values():
        for target, how in (svc.get("depends_on") or {}).items():
            assert how == {"condition": "service_healthy"}, (target, how)


def _container_variables(text: str) -> set[str]:
    """Variables a shell in the container expands (``$$VAR`` in the file: ``$VAR`` there)."""
    return set(re.findall(r"\$\$\{?([A-Z_][A-Z0-9_]*)", text))


def _script_variables(text: str) -> set[str]:
    return set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", text))


def test_every_variable_a_service_reads_is_defined(compose):
    raw = (ROOT / "docker-compose.yaml").read_text()
    example = (ROOT / "docker" / "env.example").read_text()
    for var in set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):\?", raw)):
        assert re.search(rf"^{var}=", example, re.M), f"{var} is not in docker/env.example"
    for name, svc in compose["services"].items():
        defined = set(svc.get("environment") or {}) | IMAGE_VARIABLES.get(image_of(svc), set())
        read = _container_variables(" ".join(words(svc.get("command")) + words(svc.get("entrypoint"))))
        for volume in svc.get("volumes") or []:
            src = volume.split(":")[0]
            if src.startswith("./"):
                read |= _script_variables((ROOT / src).read_text())
        assert read <= defined, f"{name} reads {sorted(read - defined)}, which it does not define"


def test_the_connect_server_starts_with_the_delta_settings_and_the_image_has_their_jars(compose, monkeypatch,
                                                                                       tmp_path):
    """The Connect server's Delta settings are tidegate's (sinks/delta/jars.py) for jars in the
    image's /opt/tidegate/jars/delta, and the Dockerfile fetches every one of them."""
    from tidegate.sinks.delta import jars

    cmd = compose["services"]["spark-connect"]["command"]
    conf = dict(c.split("=", 1) for c in (cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"))
    names = [Path(j).name for j in conf["spark.jars"].split(",")]
    for name in names:
        (tmp_path / name).touch()
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path))
    want = {k: v for k, v in jars.spark_conf().items() if k != "spark.jars"}
    assert {k: conf.get(k) for k in want} == want
    assert all(j.startswith("/opt/tidegate/jars/delta/") for j in conf["spark.jars"].split(","))
    dockerfile = (ROOT / "Dockerfile").read_text()
    version = re.search(r"ARG DELTA_VERSION=(\S+)", dockerfile).group(1)
    fetched = re.search(r"for a in ([^;]+);", dockerfile).group(1).split()
    assert sorted(names) == sorted(f"{a}-{version}.jar" for a in fetched)
    assert "/opt/tidegate/jars/delta" in dockerfile


def _conf(cmd: list[str]) -> dict[str, str]:
    return dict(c.split("=", 1) for c in (cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"))


def test_the_connect_servers_python_daemon_is_tidegates_and_the_image_can_import_it(compose):
    """Its executors' workers are forked by tidegate's daemon (the engine imported before the
    fork), a module of the package the image installs."""
    conf = _conf(compose["services"]["spark-connect"]["command"])
    assert conf["spark.python.daemon.module"] == "tidegate.spark.daemon"
    assert (ROOT / "include" / "tidegate" / "spark" / "daemon.py").is_file()
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY --chown=airflow:root include /opt/tidegate/include" in dockerfile
    assert re.search(r"^RUN pip install .*-e /opt/tidegate$", dockerfile, re.M)


def test_the_connect_server_and_spark_submit_runs_get_cores_of_their_own(compose):
    """The Connect server is a long-lived application: without a cap it holds every core of the
    worker, and a spark-submit run waits for executors forever."""
    svcs = compose["services"]
    worker = words(svcs["spark-worker"]["command"])
    worker_cores = int(worker[worker.index("--cores") + 1])
    connect_cores = int(_conf(svcs["spark-connect"]["command"])["spark.cores.max"])
    assert 0 < connect_cores < worker_cores
    master_opts = svcs["spark-master"]["environment"]["SPARK_MASTER_OPTS"]
    default = int(re.search(r"-Dspark\.deploy\.defaultCores=(\d+)", master_opts).group(1))
    assert 0 < default <= worker_cores - connect_cores
    # the master keeps the rest of the shared environment (connections are not secrets here)
    assert "AIRFLOW__CORE__EXECUTOR" in svcs["spark-master"]["environment"]
    # A worker launches an executor only where its memory is free too: the Connect server's
    # executor and a spark-submit run's (Spark's default 1g each) fit in the worker together.
    worker_mb = _megabytes(worker[worker.index("--memory") + 1])
    connect_mb = _megabytes(_conf(svcs["spark-connect"]["command"]).get("spark.executor.memory", "1g"))
    assert connect_mb + _megabytes("1g") <= worker_mb, (connect_mb, worker_mb)


def _megabytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([mg])", size.lower()).groups()
    return int(number) * (1024 if unit == "g" else 1)


def test_the_scheduler_starts_after_the_spark_connect_server_is_ready(compose):
    """Spark Connect is the stack's default for deliver tasks: the scheduler starts once the
    long-lived Connect server answers on the port its connection names, and once the worker that
    runs the executors (of the server and of spark-submit runs) has joined the master."""
    svcs = compose["services"]
    waits = svcs["airflow-scheduler"]["depends_on"]
    for server in ("spark-connect", "spark-worker", "spark-master"):
        assert waits.get(server) == {"condition": "service_healthy"}, (
            f"the scheduler does not wait for {server}")
    connect = svcs["spark-connect"]
    assert connect["restart"] in ("always", "unless-stopped")  # long-lived: restarted when it dies
    port = int(_conf(connect["command"])["spark.connect.grpc.binding.port"])
    conn = json.loads(svcs["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_CONNECT"])
    assert (conn["conn_type"], conn["host"], conn["port"]) == ("spark_connect", "sc://spark-connect", port)
    # Ready means the gRPC port is bound: SparkConnectServer binds it only after its SparkContext
    # has started (registered with the master), so a check of that port is a check of the server.
    probe = " ".join(connect["healthcheck"]["test"])
    assert f"('localhost', {port})" in probe


def test_the_kafka_broker_keeps_its_data_and_transaction_state_on_its_volume(compose):
    kafka = compose["services"]["kafka"]
    mounts = {v.split(":")[1] for v in kafka["volumes"] if not v.startswith("./")}
    assert kafka["environment"]["KAFKA_LOG_DIRS"] in mounts


def test_the_image_builds_the_compiled_hot_path_and_fails_without_it():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"apt-get install[^\n]*\bgcc\b", dockerfile)
    assert re.search(r"^RUN python /opt/tidegate/scripts/build_native\.py", dockerfile, re.M)
    assert 'import tidegate.native.rowcodec' in dockerfile


def test_the_image_installs_every_library_the_engine_imports():
    """Each third-party module imported by the engine, the Spark entry points or the plugins is
    installed by the image's pip line (Airflow and what it brings aside)."""
    import importlib.metadata as md
    import sys

    dockerfile = (ROOT / "Dockerfile").read_text()
    listed = {n.lower() for n in re.search(r"grep -E '\^\(([^)]*)\)==", dockerfile).group(1).split("|")}
    dists = md.packages_distributions()
    imported = set()
    for folder in ("include/tidegate", "spark_jobs", "plugins", "dags"):
        for path in (ROOT / folder).rglob("*.py"):
            imported |= set(re.findall(r"^\s*(?:import|from) ([a-zA-Z_]\w*)", path.read_text(), re.M))
    own = {"tidegate", "tidegate_airflow", "airflow", "fastapi"}  # fastapi: Airflow's API server's
    third = {m for m in imported - own if m not in sys.stdlib_module_names and m in dists}
    missing = {m: dists[m] for m in third if not {d.lower() for d in dists[m]} & listed}
    assert not missing, f"the Dockerfile's pip line lacks {missing}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves ``path`` out, as Docker reads .dockerignore: a pattern
    matches the path or one of its folders (``*`` within a name, ``**/`` any folders), later lines
    win, a ``!`` line keeps."""
    def regex(pattern: str) -> str:
        out = re.escape(pattern.strip("/")).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
        return out.replace(r"\?", "[^/]")

    parts = path.split("/")
    folders = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        if any(re.fullmatch(regex(pattern.lstrip("!")), f) for f in folders):
            ignored = not keep
    return ignored


def test_the_build_context_leaves_out_local_state_and_the_host_built_module():
    """`docker compose build` sends the project folder: without a .dockerignore it would send the
    test servers' data (.services), the local state and a module compiled on the host, which
    `COPY include` would put into the image beside the one the image compiles."""
    ignore = ROOT / ".dockerignore"
    assert ignore.is_file(), "no .dockerignore"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    for local in (".services/mysql/data/ibdata1", ".venv/bin/python", ".state/store.sqlite", ".demo/env",
                  "build/temp/rowcodec.o", "jars/delta/delta-storage-4.4.0.jar", ".git/HEAD",
                  "include/tidegate/native/rowcodec.cpython-311-x86_64-linux-gnu.so",
                  "include/tidegate/__pycache__/config.cpython-311.pyc"):
        assert _ignored(local, patterns), f"the build context sends {local}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", dockerfile, re.M):
        for source in line.split()[:-1]:
            assert not _ignored(source, patterns), f".dockerignore leaves out {source} (COPY)"
    rowcodec = (ROOT / "include" / "tidegate" / "native" / "rowcodec.pyx").read_text()
    pxi = [f"include/tidegate/{name}" for name in re.findall(r'^include "(.+)"$', rowcodec, re.M)]
    assert pxi and all((ROOT / f).is_file() for f in pxi), pxi  # the roles rowcodec.pyx includes
    for source in ("include/tidegate/native/rowcodec.pyx", "include/tidegate/native/sha1.h",
                   "include/tidegate/native/__init__.py", *pxi):
        assert not _ignored(source, patterns), f".dockerignore leaves out {source}, which the build compiles"
