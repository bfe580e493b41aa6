package dynamostore

// Metered reports that DynamoDB bills every request (driver.Metered): a relay alone
// in its fleet reads the relay items less often between rounds.
func (s driverStore) Metered() bool { return true }
