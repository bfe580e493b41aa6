// Package sqsemulator starts the SQS emulator the repository pins (testdata/sqs) for
// tests: it installs it with npm ci when node_modules is missing, runs it as a child
// process on a free 127.0.0.1 port and stops it when the test ends. The child also
// exits when its standard input closes, so it cannot outlive a killed test binary.
//
// Without node or npm, or when the emulator does not start, tests are skipped — and
// fail under CI=true.
package sqsemulator

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/testenv"
)

// Server is one running emulator process.
type Server struct {
	// URL is the endpoint, http://127.0.0.1:PORT.
	URL string

	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *bytes.Buffer
	once   sync.Once
	done   chan struct{}
}

var (
	installOnce sync.Once
	installErr  error

	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
)

// unavailable skips the test, or fails it under CI=true.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	testenv.Unavailable(tb, "the SQS emulator (it needs node and npm)", fmt.Errorf(format, args...))
}

// Shared returns the package's emulator, started on first use. Call [StopShared] from
// TestMain after the tests ran.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		unavailable(tb, "%v", sharedErr)
	}
	return shared
}

// StopShared stops the shared emulator if it was started.
func StopShared() {
	if shared != nil {
		shared.Stop()
	}
}

// Start starts an emulator of the test's own, stopped in cleanup.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s, err := start()
	if err != nil {
		unavailable(tb, "%v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func start() (*Server, error) {
	dir, err := findDir()
	if err != nil {
		return nil, err
	}
	installOnce.Do(func() { installErr = install(dir) })
	if installErr != nil {
		return nil, installErr
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("node not found: %w", err)
	}
	s := &Server{stderr: new(bytes.Buffer), done: make(chan struct{})}
	s.cmd = exec.Command(node, "start.js", "0")
	s.cmd.Dir = dir
	s.cmd.Stderr = s.stderr
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start emulator: %w", err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	line := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		l, _ := r.ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, r)
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, "http://127.0.0.1:") {
			s.Stop()
			return nil, fmt.Errorf("emulator did not start: %q %s", l, s.stderr.String())
		}
		s.URL = l
		return s, nil
	case <-time.After(30 * time.Second):
		s.Stop()
		return nil, fmt.Errorf("emulator did not print its address within 30s: %s", s.stderr.String())
	}
}

// Stop ends the emulator and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() {
	s.once.Do(func() {
		_ = s.stdin.Close()
		select {
		case <-s.done:
			return
		case <-time.After(2 * time.Second):
		}
		_ = s.cmd.Process.Kill()
		<-s.done
	})
}

// Client returns an SQS client for the emulator with the SDK's retries turned off,
// so failures show as they happen.
func (s *Server) Client(optFns ...func(*sqs.Options)) *sqs.Client {
	opts := sqs.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(s.URL),
		Credentials:      credentials.NewStaticCredentialsProvider("test", "test", ""),
		RetryMaxAttempts: 1,
	}
	for _, fn := range optFns {
		fn(&opts)
	}
	return sqs.New(opts)
}

// CreateQueue creates a queue and returns its URL. Names ending in ".fifo" create
// FIFO queues. attrs are extra queue attributes.
func (s *Server) CreateQueue(tb testing.TB, name string, attrs map[string]string) string {
	tb.Helper()
	all := map[string]string{}
	if strings.HasSuffix(name, ".fifo") {
		all["FifoQueue"] = "true"
	}
	for k, v := range attrs {
		all[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := s.Client().CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: all})
	if err != nil {
		tb.Fatalf("create queue %s: %v", name, err)
	}
	return *out.QueueUrl
}

// findDir finds the repository's testdata/sqs above the working directory (go test
// runs in the package directory, which may sit in a module nested in the repository).
func findDir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		d := filepath.Join(dir, "testdata", "sqs")
		if _, err := os.Stat(filepath.Join(d, "package.json")); err == nil {
			return d, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("no emulator set-up (testdata/sqs/package.json) above " + wd)
		}
	}
}

func installed(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "node_modules", "local-aws-sqs", "package.json"))
	return err == nil
}

// install runs npm ci once, under a file lock so that test binaries starting in
// parallel do not install over one another.
func install(dir string) error {
	if installed(dir) {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("npm not found: %w", err)
	}
	unlock, err := lock(filepath.Join(dir, "node_modules.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if installed(dir) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w: %s", dir, err, out)
	}
	return nil
}
