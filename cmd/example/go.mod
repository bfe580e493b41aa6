module github.com/outboxkit/outbox/cmd/example

go 1.26.0

require (
	github.com/outboxkit/outbox v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/internal/sqsemulator v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/store/sqlstore v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/kafkatransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/natstransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/rabbitmqtransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/redistransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/sqstransport v0.0.0-00010101000000-000000000000
	github.com/outboxkit/outbox/transport/watermilltransport v0.0.0-00010101000000-000000000000
)

require (
	github.com/ThreeDotsLabs/watermill v1.5.1
	github.com/ThreeDotsLabs/watermill-amqp/v3 v3.0.2
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/credentials v1.21.0
	github.com/aws/aws-sdk-go-v2/service/sqs v1.53.0
	github.com/glebarez/go-sqlite v1.23.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/google/uuid v1.6.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stretchr/testify v1.12.1
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/cenkalti/backoff/v3 v3.2.2 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dustin/go-humanize v1.0.1 // indirect
	github.com/hashicorp/errwrap v1.1.0 // indirect
	github.com/hashicorp/go-multierror v1.1.1 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pglogrepl v0.0.0-20251213150135-2e8d0df862c1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/lithammer/shortuuid/v3 v3.0.7 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/ncruces/go-strftime v1.0.0 // indirect
	github.com/oklog/ulid v1.3.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/remyoudompheng/bigfft v0.0.0-20230129092748-24d4a6f8daec // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	modernc.org/libc v1.74.1 // indirect
	modernc.org/mathutil v1.7.1 // indirect
	modernc.org/memory v1.11.0 // indirect
	modernc.org/sqlite v1.55.0 // indirect
)

replace (
	github.com/outboxkit/outbox => ../..
	github.com/outboxkit/outbox/internal/sqsemulator => ../../internal/sqsemulator
	github.com/outboxkit/outbox/store/sqlstore => ../../store/sqlstore
	github.com/outboxkit/outbox/transport/kafkatransport => ../../transport/kafkatransport
	github.com/outboxkit/outbox/transport/natstransport => ../../transport/natstransport
	github.com/outboxkit/outbox/transport/rabbitmqtransport => ../../transport/rabbitmqtransport
	github.com/outboxkit/outbox/transport/redistransport => ../../transport/redistransport
	github.com/outboxkit/outbox/transport/sqstransport => ../../transport/sqstransport
	github.com/outboxkit/outbox/transport/watermilltransport => ../../transport/watermilltransport
)
