// Command outboxctl is the outbox's operator tool: it reads the backlog, lists and
// shows messages, requeues and purges parked ones, shows leases and relays, applies
// the SQL migrations or creates the DynamoDB table, and serves a small admin page.
//
//	outboxctl stats    -store postgres://app@db/app
//	outboxctl list     -store … -status parked -topic orders [-json]
//	outboxctl show     -store … ID
//	outboxctl requeue  -store … (-all | -topic T | ID…) [-dry-run]
//	outboxctl purge    -store … (-all | -topic T | ID…) [-dry-run]
//	outboxctl leases   -store …
//	outboxctl migrate  -store postgres://…|mysql://…|sqlite:PATH [-status]
//	outboxctl drop-log -store postgres://… -yes
//	outboxctl ddl      -store …
//	outboxctl create-table -store dynamodb://TABLE -aws-region R [-aws-endpoint URL]
//	outboxctl serve    -store … [-listen 127.0.0.1:8080] [-allow-writes] [-token T] [-host NAME]
//
// Every command takes -log-mode (with -slot, -publication and -replication-url) for a
// PostgreSQL store in the SQL store's log mode: migrate then also creates the
// publication and the replication slot, stats reports the slot's lag, leases shows
// the stream reader's lease, and the admin page the slot's lag. drop-log drops the
// slot and the publication (the log mode's names, with or without -log-mode).
//
// Every command reads the bucket count the store records (a SQL store's settings
// table, a DynamoDB store's messages and relay heartbeats) and refuses a -buckets
// that differs from it.
//
// Every flag can also be set through an environment variable: OUTBOX_ and the flag's
// name in upper case with '-' as '_' (-store is OUTBOX_STORE). A flag on the command
// line wins. Run "outboxctl help" or "outboxctl COMMAND -help" for every flag.
//
// Exit codes, for scripts:
//
//	0  done (requeue and purge: also when nothing matched)
//	1  the store failed or refused the operation (the message says why)
//	2  bad usage or input: an unknown command or flag, a missing store, or a flag or
//	   argument the command cannot use (an unparsable -store, a -table that is no
//	   table name, a -buckets the store's recorded count contradicts, a -bucket the
//	   store does not have, a negative -limit, -allow-writes beyond loopback without
//	   -token, -log-mode for a store that is not PostgreSQL, drop-log without -yes);
//	   the message names the flag. Nothing was changed.
//	3  not found (show: no message has that ID)
//	4  interrupted: a requeue or purge stopped early on SIGINT or SIGTERM; what
//	   it reported as done is done, and running it again finishes the rest
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	_ "time/tzdata" // -time-zone works on hosts without a zone database
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitInterrupted = 4
)

// errNotFound and errInterrupted carry their exit codes.
var (
	errNotFound    = errors.New("not found")
	errInterrupted = errors.New("interrupted")
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand.
type command struct {
	name, args, summary string
	run                 func(ctx context.Context, c *cli, args []string) error
}

var commands []command

func init() {
	commands = []command{
		{"stats", "[-json]", "pending messages per bucket, oldest pending age, parked count", cmdStats},
		{"list", "[-status S] [-topic T] [-bucket N] [-limit N] [-json]", "list messages by status, topic or bucket", cmdList},
		{"show", "ID", "one message in full: headers, payload, attempts, last error", cmdShow},
		{"requeue", "(-all | -topic T | ID…) [-dry-run]", "make parked messages pending again, due now, attempts reset", cmdRequeue},
		{"purge", "(-all | -topic T | ID…) [-dry-run]", "delete parked messages (by ID: any status)", cmdPurge},
		{"leases", "[-json]", "buckets, their owners and expiries; relays and their heartbeats", cmdLeases},
		{"migrate", "[-status] [-log-mode]", "SQL stores: create or upgrade the tables (safe to repeat), with -log-mode also the publication and the slot; -status lists the migrations applied", cmdMigrate},
		{"drop-log", "-yes", "PostgreSQL: drop the log mode's replication slot and publication; the messages in the log no relay has read are lost", cmdDropLog},
		{"ddl", "", "SQL stores: print the statements migrate applies", cmdDDL},
		{"create-table", "", "DynamoDB: create the table unless it exists", cmdCreateTable},
		{"serve", "[-listen ADDR] [-allow-writes] [-token T] [-host NAME]…", "serve the admin page: backlog, leases, relays, messages to page through and filter", cmdServe},
	}
}

// cli is what every command shares.
type cli struct {
	stdout, stderr io.Writer
	store          storeOptions
	json           bool
	// pos are the arguments that are not flags.
	pos []string
	// noLearn opens the store without reading the bucket count it records.
	noLearn bool
	// only, when set, refuses a store the command does not work on, before the
	// store is read.
	only func(*openedStore) error
	// bucketsFrom says where the bucket count came from, once the store is open.
	bucketsFrom string
}

func usage(w io.Writer) {
	fmt.Fprint(w, "Usage: outboxctl COMMAND -store DSN [flags] [args]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n      %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintf(w, "\nThe store: -store postgres://USER@HOST/DB?sslmode=…, mysql://USER@tcp(HOST:3306)/DB?parseTime=true,\n"+
		"sqlite:PATH or dynamodb://TABLE (with -aws-region and, for a local server, -aws-endpoint);\n"+
		"a PostgreSQL store in the log mode: -log-mode [-slot S] [-publication P] [-replication-url URL].\n"+
		"Every flag may be set by an environment variable: %s and the flag in upper case, '-' as '_'.\n"+
		"Run \"outboxctl COMMAND -help\" for a command's flags.\n\n"+
		"Exit codes: 0 done (also when nothing matched), 1 the store failed or refused,\n"+
		"2 bad usage or input (an unknown command or flag, or a flag or argument the command cannot use:\n"+
		"  the message names it, and nothing was changed), 3 not found, 4 interrupted (run it again to finish).\n", envPrefix)
}

// run is the whole program; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	if name == "help" || name == "-help" || name == "--help" || name == "-h" {
		usage(stdout)
		// Every command's flags: a command given -help prints them and stops.
		for _, cmd := range commands {
			fmt.Fprintln(stdout)
			_ = cmd.run(ctx, &cli{stdout: stdout, stderr: stdout}, []string{"-help"})
		}
		return exitOK
	}
	for _, cmd := range commands {
		if cmd.name != name {
			continue
		}
		c := &cli{stdout: stdout, stderr: stderr}
		err := cmd.run(ctx, c, args[1:])
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, errHelp):
			return exitOK
		case errors.Is(err, errUsage):
			fmt.Fprintln(stderr, "outboxctl "+name+":", err)
			return exitUsage
		case errors.Is(err, errNotFound):
			fmt.Fprintln(stderr, "outboxctl "+name+":", err)
			return exitNotFound
		case errors.Is(err, errInterrupted):
			fmt.Fprintln(stderr, "outboxctl "+name+":", err)
			return exitInterrupted
		}
		fmt.Fprintln(stderr, "outboxctl "+name+":", err)
		return exitFailed
	}
	fmt.Fprintf(stderr, "outboxctl: unknown command %q\n\n", name)
	usage(stderr)
	return exitUsage
}
