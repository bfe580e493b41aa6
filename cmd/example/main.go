// Command example walks through the outbox with nothing to install and no server to
// run: an in-memory store with a unit of work stands in for the database, and a
// recording transport for the broker.
//
//	go run ./cmd/example
//
// It shows, and checks, three stories:
//
//  1. a naive dual write (save, then publish) that loses its message when the process
//     crashes in between;
//  2. Immediate mode, where the send is durable before Send returns, survives the crash,
//     and is redelivered at least once when the relay itself crashes mid-way;
//  3. Transactional mode, where the order and its message commit in one unit of work,
//     and a rollback discards both.
//
// It exits with status 1 if any story does not turn out as told.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}
