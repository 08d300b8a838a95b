-- An in-memory sqlite3 database of ~130 MiB (sqlite's page cache and row
-- buffers are malloc()ed, most below 16 KiB): 500k rows with an index,
-- then aggregates and an update; prints digests only.
PRAGMA cache_size = -400000;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v TEXT, n INTEGER);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 500000)
INSERT INTO t SELECT i, printf('key-%08d', (i * 7919) % 1000003), printf('%.*c', 60 + i % 80, 'x'),
  (i * 31) % 1009 FROM c;
CREATE INDEX t_k ON t(k);
SELECT count(*), sum(length(v)), sum(n) FROM t;
SELECT n % 10, count(*), sum(length(k)) FROM t GROUP BY n % 10 ORDER BY 1;
UPDATE t SET v = v || 'y' WHERE n % 3 = 0;
SELECT count(*), total(length(v)) FROM t WHERE k BETWEEN 'key-00100000' AND 'key-00600000';
SELECT k, n FROM t ORDER BY k LIMIT 3 OFFSET 250000;
