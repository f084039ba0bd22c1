#!/bin/bash
# First start of the mariadb container: the least-privilege CDC login (as scripts/services does).
set -euo pipefail
mariadb -uroot -p"${MARIADB_ROOT_PASSWORD}" <<SQL
CREATE USER 'tidegate_cdc'@'%' IDENTIFIED BY '${MYSQL_CDC_PASSWORD}';
GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR, REPLICATION CLIENT ON *.* TO 'tidegate_cdc'@'%';
SQL
