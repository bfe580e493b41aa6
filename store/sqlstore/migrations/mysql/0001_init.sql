CREATE TABLE IF NOT EXISTS {{.Table}} (
    seq             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id              BINARY(16)   NOT NULL,
    bucket          INT          NOT NULL,
    bucket_count    INT          NOT NULL,
    topic           VARCHAR(255) NOT NULL,
    msg_key         BLOB         NOT NULL,
    payload         LONGBLOB     NOT NULL,
    headers         MEDIUMBLOB   NOT NULL,
    part            INT          NOT NULL,
    flags           SMALLINT     NOT NULL,
    created_at      BIGINT       NOT NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at BIGINT       NOT NULL DEFAULT 0,
    status          SMALLINT     NOT NULL DEFAULT 0,
    last_error      TEXT         NOT NULL,
    dispatched_at   BIGINT       NOT NULL DEFAULT 0,
    INDEX {{.Index "head"}} (status, bucket, seq),
    UNIQUE INDEX {{.Index "id"}} (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS {{.LeaseTable}} (
    bucket     INT          NOT NULL PRIMARY KEY,
    owner      VARCHAR(255) NOT NULL DEFAULT '',
    expires_at BIGINT       NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS {{.RelayTable}} (
    id         VARCHAR(255) NOT NULL PRIMARY KEY,
    last_seen  BIGINT       NOT NULL,
    stopped_at BIGINT       NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
