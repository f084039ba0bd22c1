# The tidegate image: the official Airflow image with this project and its client libraries, and
# a Java runtime for spark-submit. docker-compose.yaml runs Airflow (api-server, scheduler,
# dag-processor) and the Spark master and worker from it, so the Spark driver and executors
# have the same Python and the same tidegate.
FROM apache/airflow:3.3.2-python3.11

USER root
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless gcc libc6-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

USER airflow
# The exact pins of requirements.txt for what tidegate adds to Airflow.
COPY --chown=airflow:root requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir "apache-airflow==3.3.2" $(grep -E '^(apache-airflow-providers-apache-spark|pyspark|pyspark-client|py4j|confluent-kafka|nats-py|nkeys|PyNaCl|redis|psycopg2-binary|PyMySQL|mysql-replication|PyYAML|asyncpg|pyarrow|pandas|statsd|orjson|zstandard|msgspec|Cython)==' /tmp/requirements.txt)

COPY --chown=airflow:root pyproject.toml README.md /opt/tidegate/
COPY --chown=airflow:root include /opt/tidegate/include
COPY --chown=airflow:root dags /opt/tidegate/dags
COPY --chown=airflow:root plugins /opt/tidegate/plugins
COPY --chown=airflow:root spark_jobs /opt/tidegate/spark_jobs
COPY --chown=airflow:root docker/spark-connect-log4j2.properties /opt/tidegate/docker/spark-connect-log4j2.properties
RUN pip install --no-cache-dir --no-deps -e /opt/tidegate
# The compiled hot path (include/tidegate/native, docs/architecture.md), built as `make install`
# builds it: without it every run in the stack would take the slower pure-Python path. The
# import fails the build if the module is missing.
COPY --chown=airflow:root scripts/build_native.py /opt/tidegate/scripts/build_native.py
RUN python /opt/tidegate/scripts/build_native.py --force \
 && python -c "import tidegate.native.rowcodec"
# Delta Lake's jars (kind: delta sinks; the io.delta artifacts scripts/delta/pom.xml fetches for
# `make install`), where tidegate.sinks.delta.jars looks: jars/delta of the project.
ARG DELTA_VERSION=4.4.0
RUN mkdir -p /opt/tidegate/jars/delta && cd /opt/tidegate/jars/delta \
 && for a in delta-spark_4.2_2.13 delta-storage delta-kernel-api delta-kernel-defaults delta-kernel-unitycatalog; do \
      curl -fsSLO "https://repo1.maven.org/maven2/io/delta/$a/${DELTA_VERSION}/$a-${DELTA_VERSION}.jar" || exit 1; \
    done

ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/tidegate/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/tidegate/plugins \
    TIDEGATE_PIPELINES_DIR=/opt/tidegate/include/pipelines
