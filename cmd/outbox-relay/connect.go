package main

import "github.com/outboxkit/outbox/cmd/internal/storeconn"

// The store this program works on, opened as every program of the project opens it.
type (
	storeOptions = storeconn.Options
	openedStore  = storeconn.Store
)

var (
	errUsage          = storeconn.ErrUsage
	openStore         = storeconn.Open
	addLogModeFlags   = storeconn.AddLogModeFlags
	awsConfig         = storeconn.AWSConfig
	dynamoCreateTable = storeconn.CreateDynamoTable
)
