"""The backlog both Debezium and tidegate capture, per source: every column type the issue
lists, NULLs, multi-row transactions, a key change, deletes, TRUNCATE and an ADD COLUMN; column
defaults of every kind and NULL written into such columns, FLOAT(M,D), NaN/Infinity/-0 and
NUMERIC without scale ending in zeros, PostgreSQL domains, tables left at REPLICA IDENTITY
DEFAULT (updates, a key change, deletes) and an unchanged TOASTed bytea and text. The tables
of harness.VARIANTS (MariaDB t_modes, PostgreSQL t_floats, and t_trunc) are compared a second
time with other connector modes.

Each source has SETUP (tables, made before either side starts reading), BACKLOG (a list of
transactions, each a list of statements, run in order) and END (the stop table's row: Debezium's
capture stops at it). The names are fixed so that recorded outputs stay comparable; the test
drops everything at the start and at the end.
"""

from __future__ import annotations

MARIADB_DB = "tidegate_compat"
POSTGRES_SCHEMA = "tidegate_compat"
STOP_TABLE = "compat_end"
PROBE_TABLE = "compat_probe"

_M = MARIADB_DB

MARIADB_SETUP = [
    f"DROP DATABASE IF EXISTS {_M}",
    f"CREATE DATABASE {_M} CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
    f"""CREATE TABLE {_M}.t_ints (id INT PRIMARY KEY,
        ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
        mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED,
        bi BIGINT, biu BIGINT UNSIGNED, bo BOOLEAN)""",
    f"""CREATE TABLE {_M}.t_nums (id INT PRIMARY KEY,
        d DECIMAL(12,4), d0 DECIMAL(20,0), dl DECIMAL(38,10), f FLOAT, db DOUBLE,
        b1 BIT(1), b12 BIT(12), b64 BIT(64))""",
    f"""CREATE TABLE {_M}.t_times (id INT PRIMARY KEY,
        dt DATE, tm TIME, tm3 TIME(3), tm6 TIME(6), dtm DATETIME, dtm3 DATETIME(3), dtm6 DATETIME(6),
        ts TIMESTAMP NULL DEFAULT NULL, ts3 TIMESTAMP(3) NULL DEFAULT NULL,
        ts6 TIMESTAMP(6) NULL DEFAULT NULL, y YEAR)""",
    f"""CREATE TABLE {_M}.t_texts (id INT PRIMARY KEY,
        c CHAR(10), vc VARCHAR(100), tx TEXT, mt MEDIUMTEXT, bn BINARY(4), vb VARBINARY(16), bl BLOB,
        e ENUM('red','green','blue'), s SET('a','b','c'), j JSON, g POINT NULL, geo GEOMETRY NULL)
        CHARACTER SET utf8mb4""",
    f"CREATE TABLE {_M}.t_keys (id INT PRIMARY KEY, v VARCHAR(20))",
    f"CREATE TABLE {_M}.t_composite (a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))",
    f"CREATE TABLE {_M}.t_trunc (id INT PRIMARY KEY, v VARCHAR(20))",
    f"CREATE TABLE {_M}.t_alter (id INT PRIMARY KEY, v VARCHAR(20))",
    # defaults in the schema, and NULL written into columns that have one (the JSON converter
    # writes the default instead)
    f"""CREATE TABLE {_M}.t_defaults (id INT PRIMARY KEY, i INT NULL DEFAULT 5,
        v VARCHAR(10) NULL DEFAULT 'dflt', dt DATE NULL DEFAULT '2020-01-02',
        dtm DATETIME NULL DEFAULT '2020-01-02 03:04:05', tm3 TIME(3) NULL DEFAULT '12:34:56.789',
        b12 BIT(12) NULL DEFAULT b'101', biu BIGINT UNSIGNED NULL DEFAULT 18446744073709551615,
        d DECIMAL(6,2) NULL DEFAULT 1.50)""",
    f"CREATE TABLE {_M}.t_floats (id INT PRIMARY KEY, f73 FLOAT(7,3), f FLOAT, db DOUBLE)",
    # the values of the mode variant (MODES_VARIANT): decimal string, time connect
    f"CREATE TABLE {_M}.t_modes (id INT PRIMARY KEY, d65 DECIMAL(65,30), tm TIME, tm6 TIME(6))",
    f"CREATE TABLE {_M}.{STOP_TABLE} (id INT PRIMARY KEY)",
    f"CREATE TABLE {_M}.{PROBE_TABLE} (id INT AUTO_INCREMENT PRIMARY KEY)",
]

MARIADB_BACKLOG = [
    # integers at both ends of every width, signed and unsigned, and a row of NULLs
    [f"INSERT INTO {_M}.t_ints VALUES (1, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648,"
     f" 4294967295, -9223372036854775808, 18446744073709551615, TRUE)",
     f"INSERT INTO {_M}.t_ints VALUES (2, 127, 0, 32767, 0, 8388607, 0, 2147483647, 0,"
     f" 9223372036854775807, 0, FALSE)",
     f"INSERT INTO {_M}.t_ints (id) VALUES (3)"],
    [f"INSERT INTO {_M}.t_nums VALUES (1, 12345678.1234, 99999999999999999999,"
     f" 1234567890123456789012345678.0123456789, 1.5, 2.718281828459045, b'1', b'101010101010',"
     f" b'1000000000000000000000000000000000000000000000000000000000000001')",
     f"INSERT INTO {_M}.t_nums VALUES (2, -0.0001, -1, 0, -3.25, -1e300, b'0', b'0', b'0')",
     f"INSERT INTO {_M}.t_nums (id) VALUES (3)"],
    [f"INSERT INTO {_M}.t_times VALUES (1, '2024-02-29', '23:59:59', '-838:59:59.000', '12:34:56.789012',"
     f" '2024-02-29 23:59:59', '1970-01-01 00:00:00.123', '9999-12-31 23:59:59.999999',"
     f" '2024-02-29 12:00:00', '2038-01-19 03:14:07.999', '1970-01-01 00:00:01.000001', 2024)",
     f"INSERT INTO {_M}.t_times VALUES (2, '1000-01-01', '00:00:00', '838:59:59.000', '-00:00:00.000001',"
     f" '1000-01-01 00:00:00', '2000-01-01 00:00:00.5', '1999-12-31 23:59:59.000001',"
     f" '2000-01-01 00:00:00', '2000-01-01 00:00:00.001', '2000-01-01 00:00:00.000001', 1901)",
     f"INSERT INTO {_M}.t_times (id) VALUES (3)"],
    [f"INSERT INTO {_M}.t_texts VALUES (1, 'fixed', 'héllo wörld ✓', 'emoji 🌊 text', REPEAT('x', 300),"
     f" X'00ff10ab', X'deadbeef', X'0001feff', 'green', 'a,c', '{{\"k\": [1, 2.5, \"é\", null]}}',"
     f" ST_GeomFromText('POINT(1.5 -2.25)'), ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)'))",
     f"INSERT INTO {_M}.t_texts VALUES (2, '', '', '', '', X'00000000', X'', X'', 'red', '', '[]',"
     f" ST_GeomFromText('POINT(0 0)'), ST_GeomFromText('POLYGON((0 0, 4 0, 4 4, 0 0))'))",
     f"INSERT INTO {_M}.t_texts (id) VALUES (3)"],
    # updates, to NULL and from NULL
    [f"UPDATE {_M}.t_ints SET ti = NULL, biu = 1 WHERE id = 1",
     f"UPDATE {_M}.t_times SET dt = '2000-01-01', ts6 = NULL WHERE id IN (2, 3)",
     f"UPDATE {_M}.t_texts SET vc = CONCAT(vc, '!'), j = NULL WHERE id = 1"],
    # a multi-row transaction on two tables, then a key change, then deletes
    [f"INSERT INTO {_M}.t_keys VALUES (1, 'a'), (2, 'b'), (3, 'c')",
     f"INSERT INTO {_M}.t_composite VALUES (1, 'x', 10), (1, 'y', 11), (2, 'x', 12)",
     f"UPDATE {_M}.t_keys SET v = CONCAT(v, v)"],
    [f"UPDATE {_M}.t_keys SET id = 100 WHERE id = 1"],
    [f"UPDATE {_M}.t_composite SET b = 'z' WHERE a = 1 AND b = 'y'"],
    [f"DELETE FROM {_M}.t_keys WHERE id = 2",
     f"DELETE FROM {_M}.t_composite WHERE a = 2"],
    [f"DELETE FROM {_M}.t_nums WHERE id = 3"],
    [f"INSERT INTO {_M}.t_trunc VALUES (1, 'gone'), (2, 'gone too')"],
    [f"TRUNCATE TABLE {_M}.t_trunc"],
    [f"INSERT INTO {_M}.t_trunc VALUES (3, 'after')"],
    [f"INSERT INTO {_M}.t_defaults VALUES (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
     f"INSERT INTO {_M}.t_defaults (id) VALUES (2)",
     f"INSERT INTO {_M}.t_defaults VALUES (3, 1, 'x', '2001-01-01', '2001-01-01 00:00:00', '01:00:00',"
     f" b'1', 1, 0.25)",
     f"UPDATE {_M}.t_defaults SET i = NULL, v = NULL WHERE id = 3"],
    [f"INSERT INTO {_M}.t_floats VALUES (1, 1234.567, 1234.567, -0e0), (2, -0.001, 0.1, 1e-300),"
     f" (3, NULL, NULL, NULL)"],
    [f"INSERT INTO {_M}.t_modes VALUES (1, -0.000000000000000000000000000001, '-838:59:59',"
     f" '100:00:00.000001'), (2, 0, '12:00:00', '23:59:59.999999'),"
     f" (3, 12345.5, '838:59:59', '-00:00:01'), (4, NULL, '00:00:00', '24:00:00')"],
    [f"INSERT INTO {_M}.t_alter VALUES (1, 'before')"],
    [f"ALTER TABLE {_M}.t_alter ADD COLUMN extra INT NULL DEFAULT 7"],
    [f"INSERT INTO {_M}.t_alter VALUES (2, 'after', 8)",
     f"UPDATE {_M}.t_alter SET v = 'changed' WHERE id = 1"],
]

MARIADB_END = [f"INSERT INTO {_M}.{STOP_TABLE} VALUES (1)"]
MARIADB_TEARDOWN = [f"DROP DATABASE IF EXISTS {_M}"]

_P = POSTGRES_SCHEMA

POSTGRES_TABLES = ["t_ints", "t_nums", "t_times", "t_texts", "t_misc", "t_keys", "t_composite",
                   "t_trunc", "t_alter", "t_defaults", "t_domains", "t_floats", STOP_TABLE]
# tables left at PostgreSQL's default REPLICA IDENTITY (the primary key): old rows are partial
POSTGRES_DEFAULT_IDENTITY = ["t_ident", "t_toast"]
POSTGRES_PUBLISHED = POSTGRES_TABLES + POSTGRES_DEFAULT_IDENTITY

POSTGRES_SETUP = [
    f"DROP SCHEMA IF EXISTS {_P} CASCADE",
    f"CREATE SCHEMA {_P}",
    f"CREATE TYPE {_P}.mood AS ENUM ('sad', 'ok', 'happy')",
    f"""CREATE TABLE {_P}.t_ints (id INT PRIMARY KEY, si SMALLINT, i INTEGER, bi BIGINT, bo BOOLEAN,
        ser SERIAL, bser BIGSERIAL)""",
    f"""CREATE TABLE {_P}.t_nums (id INT PRIMARY KEY, d NUMERIC(12,4), d0 NUMERIC(20,0), dn NUMERIC,
        r REAL, dp DOUBLE PRECISION, b1 BIT(1), b12 BIT(12), vb BIT VARYING(16), m MONEY)""",
    f"""CREATE TABLE {_P}.t_times (id INT PRIMARY KEY, dt DATE, tm TIME, tm3 TIME(3), tm6 TIME(6),
        ttz TIME WITH TIME ZONE, ts TIMESTAMP, ts3 TIMESTAMP(3), ts6 TIMESTAMP(6),
        tstz TIMESTAMPTZ, tstz3 TIMESTAMPTZ(3), iv INTERVAL)""",
    f"""CREATE TABLE {_P}.t_texts (id INT PRIMARY KEY, c CHAR(10), vc VARCHAR(100), tx TEXT,
        by BYTEA, e {_P}.mood, j JSON, jb JSONB, x XML)""",
    f"""CREATE TABLE {_P}.t_misc (id INT PRIMARY KEY, u UUID, ia INTEGER[], ta TEXT[],
        ip INET, cidr_ CIDR, mac MACADDR, pt POINT, ir INT4RANGE)""",
    f"CREATE TABLE {_P}.t_keys (id INT PRIMARY KEY, v VARCHAR(20))",
    f"CREATE TABLE {_P}.t_composite (a INT, b VARCHAR(10), v INT, PRIMARY KEY (a, b))",
    f"CREATE TABLE {_P}.t_trunc (id INT PRIMARY KEY, v VARCHAR(20))",
    f"CREATE TABLE {_P}.t_alter (id INT PRIMARY KEY, v VARCHAR(20))",
    f"""CREATE TABLE {_P}.t_defaults (id INT PRIMARY KEY, i INT DEFAULT 5, v VARCHAR(10) DEFAULT 'dflt',
        dt DATE DEFAULT '2020-01-02', ts TIMESTAMP DEFAULT '2020-01-02 03:04:05',
        ts3 TIMESTAMP(3) DEFAULT '2020-01-02 03:04:05.678', by BYTEA DEFAULT '\\x00ff',
        n NUMERIC(6,2) DEFAULT 1.5)""",
    f"CREATE DOMAIN {_P}.posint AS integer CHECK (VALUE > 0)",
    f"CREATE DOMAIN {_P}.amount AS NUMERIC(12,2)",
    f"CREATE TABLE {_P}.t_domains (id {_P}.posint PRIMARY KEY, amt {_P}.amount)",
    f"CREATE TABLE {_P}.t_floats (id INT PRIMARY KEY, r REAL, dp DOUBLE PRECISION, dn NUMERIC)",
    f"CREATE TABLE {_P}.t_ident (id INT PRIMARY KEY, v TEXT, n INT)",
    f"CREATE TABLE {_P}.t_toast (id INT PRIMARY KEY, n INT, by BYTEA, tx TEXT)",
    f"CREATE TABLE {_P}.{STOP_TABLE} (id INT PRIMARY KEY)",
    *[f"ALTER TABLE {_P}.{t} REPLICA IDENTITY FULL" for t in POSTGRES_TABLES],
]

POSTGRES_BACKLOG = [
    [f"INSERT INTO {_P}.t_ints (id, si, i, bi, bo) VALUES (1, -32768, -2147483648,"
     f" -9223372036854775808, TRUE)",
     f"INSERT INTO {_P}.t_ints (id, si, i, bi, bo) VALUES (2, 32767, 2147483647, 9223372036854775807, FALSE)",
     f"INSERT INTO {_P}.t_ints (id) VALUES (3)"],
    [f"INSERT INTO {_P}.t_nums VALUES (1, 12345678.1234, 99999999999999999999,"
     f" 1234567890123456789012345678.0123456789, 1.5, 2.718281828459045, B'1', B'101010101010',"
     f" B'1011', 1234.56)",
     f"INSERT INTO {_P}.t_nums VALUES (2, -0.0001, -1, 0.000000001, -3.25, -1e300, B'0', B'000000000000',"
     f" B'', -0.01)",
     f"INSERT INTO {_P}.t_nums (id) VALUES (3)"],
    [f"INSERT INTO {_P}.t_times VALUES (1, '2024-02-29', '23:59:59', '12:34:56.789', '12:34:56.789012',"
     f" '12:34:56.5+02:00', '2024-02-29 23:59:59', '1970-01-01 00:00:00.123',"
     f" '9999-12-31 23:59:59.999999', '2024-02-29 12:00:00+00', '2038-01-19 03:14:07.999+05:30',"
     f" '1 year 2 mons 3 days 04:05:06.789')",
     f"INSERT INTO {_P}.t_times VALUES (2, '0001-01-01', '00:00:00', '00:00:00.001', '24:00:00',"
     f" '00:00:00-08:00', '1900-01-01 00:00:00', '2000-01-01 00:00:00.5', '1999-12-31 23:59:59.000001',"
     f" '1969-12-31 23:59:59.999999+00', '2000-01-01 00:00:00.001-03', '-1 days -00:00:00.000001')",
     f"INSERT INTO {_P}.t_times (id) VALUES (3)"],
    [f"INSERT INTO {_P}.t_texts VALUES (1, 'fixed', 'héllo wörld ✓', 'emoji 🌊 text', '\\x00ff10ab',"
     f" 'happy', '{{\"k\": [1, 2.5, \"é\", null]}}', '{{\"b\": 1, \"a\": [true, null]}}', '<a>x</a>')",
     f"INSERT INTO {_P}.t_texts VALUES (2, '', '', '', '\\x', 'sad', '[]', '{{}}', '<b/>')",
     f"INSERT INTO {_P}.t_texts (id) VALUES (3)"],
    [f"INSERT INTO {_P}.t_misc VALUES (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{1,2,NULL,4}}',"
     f" '{{\"a\",\"b c\",NULL}}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', '(1.5,-2.25)',"
     f" '[1,10)')",
     f"INSERT INTO {_P}.t_misc VALUES (2, '00000000-0000-0000-0000-000000000000', '{{}}', '{{}}', '::1',"
     f" '2001:db8::/32', '00:00:00:00:00:00', '(0,0)', 'empty')",
     f"INSERT INTO {_P}.t_misc (id) VALUES (3)"],
    [f"UPDATE {_P}.t_ints SET si = NULL, bi = 1 WHERE id = 1",
     f"UPDATE {_P}.t_times SET dt = '2000-01-01', ts6 = NULL WHERE id IN (2, 3)",
     f"UPDATE {_P}.t_texts SET vc = vc || '!', j = NULL WHERE id = 1"],
    [f"INSERT INTO {_P}.t_keys VALUES (1, 'a'), (2, 'b'), (3, 'c')",
     f"INSERT INTO {_P}.t_composite VALUES (1, 'x', 10), (1, 'y', 11), (2, 'x', 12)",
     f"UPDATE {_P}.t_keys SET v = v || v"],
    [f"UPDATE {_P}.t_keys SET id = 100 WHERE id = 1"],
    [f"UPDATE {_P}.t_composite SET b = 'z' WHERE a = 1 AND b = 'y'"],
    [f"DELETE FROM {_P}.t_keys WHERE id = 2",
     f"DELETE FROM {_P}.t_composite WHERE a = 2"],
    [f"DELETE FROM {_P}.t_nums WHERE id = 3"],
    [f"INSERT INTO {_P}.t_trunc VALUES (1, 'gone'), (2, 'gone too')"],
    [f"TRUNCATE TABLE {_P}.t_trunc"],
    [f"INSERT INTO {_P}.t_trunc VALUES (3, 'after')"],
    [f"INSERT INTO {_P}.t_defaults VALUES (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
     f"INSERT INTO {_P}.t_defaults (id) VALUES (2)",
     f"INSERT INTO {_P}.t_defaults VALUES (3, 1, 'x', '2001-01-01', '2001-01-01 00:00:00',"
     f" '2001-01-01 00:00:00.5', '\\x01', 0.25)",
     f"UPDATE {_P}.t_defaults SET i = NULL, v = NULL WHERE id = 3"],
    [f"INSERT INTO {_P}.t_domains VALUES (1, 12.5), (2, NULL)",
     f"UPDATE {_P}.t_domains SET amt = 1000.01 WHERE id = 1"],
    [f"INSERT INTO {_P}.t_floats VALUES (1, 'NaN', 'Infinity', 1.50), (2, '-Infinity', '-0', 10.0),"
     f" (3, 'Infinity', 'NaN', 0.000000000000000000000000000010), (4, 0, '-Infinity', 100),"
     f" (5, 1.5, 2.5, 'NaN'), (6, NULL, NULL, 12345678901234567890.123456789012345678901234567890)"],
    [f"INSERT INTO {_P}.t_ident VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)"],
    [f"UPDATE {_P}.t_ident SET v = 'changed' WHERE id = 1",
     f"UPDATE {_P}.t_ident SET id = 20 WHERE id = 2",
     f"DELETE FROM {_P}.t_ident WHERE id = 3"],
    # an unchanged TOASTed bytea and text (4800 bytes of MD5s: too big and random to stay inline)
    [f"INSERT INTO {_P}.t_toast VALUES (1, 1,"
     f" (SELECT string_agg(decode(md5(i::text), 'hex'), ''::bytea) FROM generate_series(1, 300) i),"
     f" (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i))"],
    [f"UPDATE {_P}.t_toast SET n = 2 WHERE id = 1"],
    [f"INSERT INTO {_P}.t_alter VALUES (1, 'before')"],
    [f"ALTER TABLE {_P}.t_alter ADD COLUMN extra INT NULL DEFAULT 7"],
    [f"INSERT INTO {_P}.t_alter VALUES (2, 'after', 8)",
     f"UPDATE {_P}.t_alter SET v = 'changed' WHERE id = 1"],
]

POSTGRES_END = [f"INSERT INTO {_P}.{STOP_TABLE} VALUES (1)"]
POSTGRES_TEARDOWN = [f"DROP SCHEMA IF EXISTS {_P} CASCADE"]
