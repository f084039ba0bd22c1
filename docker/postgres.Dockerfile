# PostgreSQL 15 with the wal2json logical decoding plugin (Debian's package).
FROM postgres:15.10-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15-wal2json \
 && rm -rf /var/lib/apt/lists/*
