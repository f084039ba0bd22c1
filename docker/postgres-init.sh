#!/bin/bash
# First start of the postgres container: Airflow's metadata database (own login), the
# checkpoint store database, and the least-privilege CDC login (as scripts/services creates).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
CREATE ROLE airflow LOGIN PASSWORD '${AIRFLOW_DB_PASSWORD}';
CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE tidegate_store OWNER ${POSTGRES_USER};
CREATE ROLE tidegate_cdc LOGIN REPLICATION PASSWORD '${PG_CDC_PASSWORD}';
GRANT pg_monitor TO tidegate_cdc;
SQL
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
GRANT USAGE ON SCHEMA public TO tidegate_cdc;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO tidegate_cdc;
ALTER DEFAULT PRIVILEGES FOR ROLE ${POSTGRES_USER} GRANT SELECT ON TABLES TO tidegate_cdc;
SQL
