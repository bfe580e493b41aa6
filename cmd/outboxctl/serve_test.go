package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// syncBuffer is a strings.Builder safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestServeCommand(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	ok(t, backend{args: []string{"-store", dsn}}, "migrate")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "-store", dsn, "-listen", "127.0.0.1:0", "-token", "tok"}, &out, &errOut)
	}()
	addr := regexp.MustCompile(`http://(127\.0\.0\.1:\d+)/`)
	var base string
	for deadline := time.Now().Add(time.Minute); base == ""; {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = "http://" + m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("serve exited with %d: %s", code, errOut.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "serve did not say where it listens: %q", out.String())
		time.Sleep(10 * time.Millisecond)
	}
	require.Contains(t, out.String(), "read-only")

	resp, err := http.Get(base + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the token is required")

	req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), `id="backlog-chart"`)
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'")

	req, _ = http.NewRequest(http.MethodGet, base+"/static/style.css", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "embedded assets are served")

	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code, errOut.String())
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop when its context ended")
	}
}

// startServe runs "outboxctl serve" with args until the test ends, and returns the
// address it says it serves on.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"serve"}, args...), &out, &errOut) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	addr := regexp.MustCompile(`http://([0-9.:\[\]a-f]+:\d+)/`)
	for deadline := time.Now().Add(time.Minute); ; {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-done:
			done <- code
			t.Fatalf("serve exited with %d: %s", code, errOut.String())
		default:
		}
		require.True(t, time.Now().Before(deadline), "serve did not say where it listens: %q", out.String())
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeRefusesWritesBeyondLoopbackWithoutToken(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	ok(t, backend{args: []string{"-store", dsn}}, "migrate")
	for _, listen := range []string{"0.0.0.0:0", ":0"} {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, []string{"serve", "-store", dsn, "-listen", listen, "-allow-writes"}, &out, &errOut)
		}()
		var code int
		select {
		case code = <-done:
		case <-time.After(time.Minute):
			// Still serving: the refusal this test is about did not happen.
			cancel()
			code = <-done
			t.Fatalf("serve -listen %s -allow-writes without -token started (%q); exit %d after cancel", listen, out.String(), code)
		}
		cancel()
		require.Equal(t, exitUsage, code, "stdout %q stderr %q", out.String(), errOut.String())
		for _, flag := range []string{"-allow-writes", "-token", "-listen " + listen, "OUTBOX_TOKEN"} {
			require.Contains(t, errOut.String(), flag)
		}
		require.NotContains(t, out.String(), "serving")
	}
	// With a token it serves, and read-only it serves (with a warning).
	base := startServe(t, "-store", dsn, "-listen", "0.0.0.0:0", "-allow-writes", "-token", "tok")
	_, port, _ := net.SplitHostPort(base)
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	startServe(t, "-store", dsn, "-listen", "0.0.0.0:0")
}

func TestServeHostFlag(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	ok(t, backend{args: []string{"-store", dsn}}, "migrate")
	t.Setenv("OUTBOX_HOST", "ops.example.test,Admin.Example.Test.")
	base := startServe(t, "-store", dsn, "-listen", "127.0.0.1:0", "-host", "outbox.internal.test")
	get := func(host string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+base+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	// The flag wins over the variable, as for every flag.
	require.Equal(t, http.StatusOK, get("outbox.internal.test"))
	require.Equal(t, http.StatusOK, get("outbox.internal.test:443"))
	require.Equal(t, http.StatusForbidden, get("ops.example.test"))
	require.Equal(t, http.StatusForbidden, get("evil.test"))
	require.Equal(t, http.StatusOK, get(base))

	base = startServe(t, "-store", dsn, "-listen", "127.0.0.1:0")
	req, _ := http.NewRequest(http.MethodGet, "http://"+base+"/", nil)
	req.Host = "admin.example.test"
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "OUTBOX_HOST names the hosts when -host is not given")

	var out, errOut strings.Builder
	require.Equal(t, exitUsage, run(context.Background(), []string{"serve", "-store", dsn, "-host", "http://x/"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-host")
}
