CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer   VARCHAR(100) NOT NULL,
    msg_key    VARCHAR(255) NOT NULL,
    expires_at BIGINT       NOT NULL,
    PRIMARY KEY (consumer, msg_key)
);
CREATE INDEX IF NOT EXISTS {{.Index "inbox_expires"}} ON {{.Inbox}} (expires_at);
