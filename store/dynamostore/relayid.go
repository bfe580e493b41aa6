package dynamostore

// CheckRelayID implements [driver.RelayIDChecker], so a relay id the table's keys
// cannot hold fails when the relay is built: not empty, UTF-8, and short enough for a
// sort key.
func (s driverStore) CheckRelayID(id string) error { return checkRelayID(id) }
