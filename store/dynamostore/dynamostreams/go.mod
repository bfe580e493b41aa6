module github.com/outboxkit/outbox/store/dynamostore/dynamostreams

go 1.26.0

require (
	github.com/aws/aws-sdk-go-v2/credentials v1.21.0
	github.com/outboxkit/outbox v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/store/dynamostore v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	github.com/truora/minidyn v0.8.2
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

require (
	github.com/aws/aws-lambda-go v1.55.1
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.74.0
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/endpoint-discovery v1.13.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/google/uuid v1.6.0 // indirect
)

replace (
	github.com/outboxkit/outbox => ../../..
	github.com/outboxkit/outbox/store/dynamostore => ..
)
