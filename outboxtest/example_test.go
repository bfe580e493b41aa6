package outboxtest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// A Recorder stands in for a broker: it keeps what was published and can be told to
// fail chosen messages.
func ExampleRecorder() {
	ctx := context.Background()
	rec := outboxtest.NewRecorder()

	ok, _ := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("o-1"), Payload: []byte("placed")}, 8)
	bad, _ := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("o-2"), Payload: []byte("placed")}, 8)
	rec.FailID(bad.ID, driver.Permanent(errors.New("rejected by broker")), -1)

	err := rec.Publish(ctx, []*driver.Envelope{ok, bad})
	var pe *driver.PublishError
	if errors.As(err, &pe) {
		fmt.Println("failed:", len(pe.Failed), "permanent:", driver.IsPermanent(pe.Failed[0].Err))
	}
	fmt.Println("recorded:", rec.Len())
	for key, envs := range rec.ByKey() {
		fmt.Println(key, string(envs[0].Payload))
	}
	// Output:
	// failed: 1 permanent: true
	// recorded: 1
	// o-1 placed
}

// A FaultTransport wraps a transport; SetDown simulates a broker outage.
func ExampleFaultTransport() {
	ctx := context.Background()
	rec := outboxtest.NewRecorder()
	ft, _ := outboxtest.NewFaultTransport(rec, outboxtest.Faults{})

	env, _ := driver.NewEnvelope(outbox.Message{Topic: "orders", Payload: []byte("x")}, 8)
	ft.SetDown(true)
	fmt.Println(ft.Publish(ctx, []*driver.Envelope{env}))
	ft.SetDown(false)
	fmt.Println(ft.Publish(ctx, []*driver.Envelope{env}), rec.Len())
	// Output:
	// outboxtest: injected fault: broker unavailable
	// <nil> 1
}
