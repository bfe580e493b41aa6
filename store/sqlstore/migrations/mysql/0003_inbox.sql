CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer   VARBINARY(100) NOT NULL,
    msg_key    VARBINARY(255) NOT NULL,
    expires_at BIGINT         NOT NULL,
    PRIMARY KEY (consumer, msg_key),
    INDEX {{.Index "inbox_expires"}} (expires_at)
) ENGINE=InnoDB;
