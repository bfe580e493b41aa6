module github.com/outboxkit/outbox/internal/chaostest

go 1.26.0

require (
	github.com/outboxkit/outbox v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/store/dynamostore v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/store/sqlstore v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/store/sqlstore/gormstore v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/kafkatransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/sqstransport v0.0.0-00010101000000-000000000000
)

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/credentials v1.21.0
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.74.0
	github.com/aws/aws-sdk-go-v2/service/sqs v1.53.0
	github.com/glebarez/go-sqlite v1.23.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/outboxkit/outbox/internal/sqsemulator v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	github.com/truora/minidyn v0.8.2
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.18.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	gorm.io/driver/postgres v1.6.3
	gorm.io/gorm v1.31.2
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/endpoint-discovery v1.13.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/jinzhu/now v1.1.5 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/ncruces/go-strftime v1.0.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.51.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	modernc.org/libc v1.74.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.11.0 // indirect
	modernc.org/sqlite v1.55.0 // indirect
)

replace (
	github.com/outboxkit/outbox => ../..
	github.com/outboxkit/outbox/internal/sqsemulator => ../../internal/sqsemulator
	github.com/outboxkit/outbox/store/dynamostore => ../../store/dynamostore
	github.com/outboxkit/outbox/store/sqlstore => ../../store/sqlstore
	github.com/outboxkit/outbox/store/sqlstore/gormstore => ../../store/sqlstore/gormstore
	github.com/outboxkit/outbox/transport/kafkatransport => ../../transport/kafkatransport
	github.com/outboxkit/outbox/transport/sqstransport => ../../transport/sqstransport
)
