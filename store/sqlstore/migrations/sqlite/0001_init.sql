CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              BLOB    NOT NULL,
    bucket          INTEGER NOT NULL,
    bucket_count    INTEGER NOT NULL,
    topic           TEXT    NOT NULL,
    msg_key         BLOB    NOT NULL,
    payload         BLOB    NOT NULL,
    headers         BLOB    NOT NULL,
    part            INTEGER NOT NULL,
    flags           INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT 0,
    status          INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    dispatched_at   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {{.Index "head"}} ON {{.Table}} (status, bucket, seq);
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "id"}} ON {{.Table}} (id);
CREATE TABLE IF NOT EXISTS {{.LeaseTable}} (
    bucket     INTEGER NOT NULL PRIMARY KEY,
    owner      TEXT    NOT NULL DEFAULT '',
    expires_at INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {{.RelayTable}} (
    id         TEXT    NOT NULL PRIMARY KEY,
    last_seen  INTEGER NOT NULL,
    stopped_at INTEGER NOT NULL DEFAULT 0
);
