CREATE TABLE IF NOT EXISTS {{.Table}} (
    id              UUID     NOT NULL PRIMARY KEY,
    seq             BIGINT   NOT NULL GENERATED ALWAYS AS IDENTITY,
    bucket          INTEGER  NOT NULL,
    bucket_count    INTEGER  NOT NULL,
    topic           TEXT     NOT NULL,
    msg_key         BYTEA    NOT NULL,
    payload         BYTEA    NOT NULL,
    headers         BYTEA    NOT NULL,
    part            INTEGER  NOT NULL,
    flags           SMALLINT NOT NULL,
    created_at      BIGINT   NOT NULL,
    attempts        INTEGER  NOT NULL DEFAULT 0,
    next_attempt_at BIGINT   NOT NULL DEFAULT 0,
    status          SMALLINT NOT NULL DEFAULT 0,
    last_error      TEXT     NOT NULL DEFAULT '',
    dispatched_at   BIGINT   NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS {{.Index "head"}} ON {{.Table}} (status, bucket, seq);
CREATE TABLE IF NOT EXISTS {{.LeaseTable}} (
    bucket     INTEGER      NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL DEFAULT '',
    expires_at BIGINT       NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {{.RelayTable}} (
    id         VARCHAR(255) NOT NULL PRIMARY KEY,
    last_seen  BIGINT       NOT NULL,
    stopped_at BIGINT       NOT NULL DEFAULT 0
);
