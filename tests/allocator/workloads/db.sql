-- sqlite3 :memory: < db.sql. 64 KiB pages: each page is one malloc above
-- FARMEM_MIN_FAR, so the database itself lives in far memory.
PRAGMA page_size = 65536;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, s TEXT, pad TEXT);
WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 150000)
INSERT INTO t SELECT x, (x * 2654435761) % 1000003, printf('row-%08d-%x', x, (x * 40503) % 65536),
  substr(printf('%0200d', x), 1, 120 + x % 80) FROM n;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_s ON t(s);
SELECT count(*), sum(k), min(s), max(s), sum(length(pad)) FROM t;
SELECT k % 17 AS g, count(*), sum(id) FROM t GROUP BY g ORDER BY g;
SELECT id, k, s FROM t ORDER BY k DESC LIMIT 5;
SELECT count(*) FROM t a JOIN t b ON a.k = b.id WHERE a.id % 1000 = 0;
UPDATE t SET pad = upper(pad) WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(length(pad)), total(k) FROM t;
