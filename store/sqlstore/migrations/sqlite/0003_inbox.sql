CREATE TABLE IF NOT EXISTS {{.Inbox}} (
    consumer   TEXT    NOT NULL,
    msg_key    TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, msg_key)
);
CREATE INDEX IF NOT EXISTS {{.Index "inbox_expires"}} ON {{.Inbox}} (expires_at);
