package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
)

// chromiumPath is Debian's chromium package; tests never download a browser.
const chromiumPath = "/usr/bin/chromium"

// browser starts a headless Chromium for one test, with the extra options given. On
// failure the test saves a screenshot of the page and logs where.
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		testenv.Unavailable(t, "Chromium ("+chromiumPath+", Debian's chromium package)", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelCtx := chromedp.NewContext(actx)
	// The first call starts the browser and must not carry a timeout; the test's
	// calls then run under a generous one (a busy 2-core machine is slow).
	require.NoError(t, chromedp.Do(bctx), "start Chromium")
	ctx, cancelTimeout := context.WithTimeout(bctx, 3*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			sctx, cancel := context.WithTimeout(bctx, 20*time.Second)
			if png, err := chromedp.Run(sctx, chromedp.FullScreenshot(90)); err == nil {
				dir, _ := os.MkdirTemp("", "outboxctl-failure-")
				path := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+".png")
				if os.WriteFile(path, png, 0o644) == nil {
					t.Logf("screenshot of the page at failure: %s", path)
				}
			}
			cancel()
		}
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	return ctx
}

// seedPage opens a SQLite store with a backlog that differs per bucket, parked
// messages with their errors, and a relay holding some leases.
func seedPage(t *testing.T) *openedStore {
	t.Helper()
	ctx := context.Background()
	st, err := openStore(ctx, storeOptions{DSN: "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	require.NoError(t, st.SQL.Migrate(ctx))

	var envs []*driver.Envelope
	for i := range 240 {
		topic := []string{"orders", "invoices", "shipments"}[i%3]
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "customer-%d", i%(7+i%23)), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}, st.BucketCount())
		require.NoError(t, err)
		env.CreatedAt = env.CreatedAt.Add(-time.Duration(240-i) * time.Second)
		envs = append(envs, env)
	}
	require.NoError(t, st.Enqueue(ctx, envs...))
	causes := []string{
		"kafka: MESSAGE_TOO_LARGE: the request included a message larger than the max message size the server will accept",
		"kafka: UNKNOWN_TOPIC_OR_PARTITION: this server does not host this topic-partition",
		"kafka: TOPIC_AUTHORIZATION_FAILED: not authorized to access topics: [invoices]",
	}
	for i, e := range envs[:6] {
		fetched, err := st.Fetch(ctx, e.Bucket, 1000)
		require.NoError(t, err)
		for _, f := range fetched.Envelopes {
			if f.ID == e.ID {
				require.NoError(t, st.Park(ctx, f, causes[i%len(causes)]))
			}
		}
	}
	now := time.Now()
	for i, relay := range []string{"relay-7f3a", "relay-c21e"} {
		_, err := st.Heartbeat(ctx, relay, now, st.BucketCount(), driver.Instance{})
		require.NoError(t, err)
		for b := i * 4; b < i*4+4; b++ {
			claimed, err := st.Claim(ctx, b, relay, now, now.Add(30*time.Second))
			require.NoError(t, err)
			require.True(t, claimed)
		}
	}
	return st
}

func serveStore(t *testing.T, st *openedStore, opts adminOptions) *httptest.Server {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := newAdminHandler(st, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// pageText returns the text of the first element sel matches.
func pageText(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
	require.NoError(t, err, "text of %s", sel)
	return strings.TrimSpace(v)
}

// waitText waits until the first element sel matches reads want. A click that posts
// a form navigates: until the new page is in, sel may still match the old page's
// element, or the read may fail as the page goes.
func waitText(t *testing.T, ctx context.Context, sel, want string) {
	t.Helper()
	var last string
	var lastErr error
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last, lastErr = chromedp.Run(rctx, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
		cancel()
		if lastErr == nil && strings.TrimSpace(last) == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("text of %s: %q (error %v), want %q", sel, last, lastErr, want)
}

// waitFor waits until the page in the browser has loaded and the script cond holds.
// While a click's navigation is under way, reads fail or still see the old page, so
// they are retried until a minute has passed.
func waitFor(t *testing.T, ctx context.Context, what, cond string) {
	t.Helper()
	js := `document.readyState === "complete" && !!(` + cond + `)`
	var lastErr error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := chromedp.Run(rctx, chromedp.Evaluate[bool](js))
		cancel()
		if err == nil && ok {
			return
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never came (%s): %v", what, cond, lastErr)
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	require.NoError(t, err, "%s", js)
	return v
}

func TestAdminPageInChromium(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	const token = "s3cret-token"
	srv := serveStore(t, st, adminOptions{Writes: true, Token: token})

	// Without the token: refused.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")))
	require.Contains(t, pageText(t, ctx, "body"), "unauthorized")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?token=wrong")))
	require.Contains(t, pageText(t, ctx, "body"), "wrong token")

	// With it: the page, whose numbers are the store's.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?token="+token), chromedp.WaitVisible(chromedp.CSS("#backlog-chart"))))
	stats, err := st.Store.(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	total := 0
	for _, n := range stats.Pending {
		total += n
	}
	require.Equal(t, 234, total)
	require.Equal(t, strconv.Itoa(total), pageText(t, ctx, "#pending-total"))
	require.Equal(t, 6, stats.Parked)
	require.Equal(t, strconv.Itoa(stats.Parked), pageText(t, ctx, "#parked-total"))
	oldestText := pageText(t, ctx, "#oldest-age")
	age, err := time.ParseDuration(oldestText)
	require.NoError(t, err, "oldest age %q", oldestText)
	require.GreaterOrEqual(t, age, 200*time.Second, "the oldest pending message was captured about 4 minutes ago")
	bars, err := chromedp.Run(ctx, chromedp.AttributesAll(chromedp.CSSAll("rect.bar")))
	require.NoError(t, err)
	require.Len(t, bars, st.BucketCount(), "one bar per bucket")
	for _, b := range bars {
		bucket, _ := strconv.Atoi(b["data-bucket"])
		require.Equal(t, strconv.Itoa(stats.Pending[bucket]), b["data-pending"], "bucket %d", bucket)
	}
	owners := eval[[]string](t, ctx, `[...document.querySelectorAll("#leases tr.lease td:nth-child(2)")].map(td => td.textContent.trim())`)
	require.Equal(t, []string{"relay-7f3a", "relay-7f3a", "relay-7f3a", "relay-7f3a", "relay-c21e", "relay-c21e", "relay-c21e", "relay-c21e"}, owners)
	parkedIDs := eval[[]string](t, ctx, `[...document.querySelectorAll("tr.parked")].map(tr => tr.dataset.id)`)
	require.Len(t, parkedIDs, 6)
	require.Contains(t, pageText(t, ctx, "tr.parked .error-text"), "kafka: ")

	if dir := os.Getenv("OUTBOX_SCREENSHOT_DIR"); dir != "" {
		// The screenshots in the docs come from here: OUTBOX_SCREENSHOT_DIR=docs/images,
		// in a window wide enough for the message list.
		require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1440, 1000)))
		chart, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("#backlog-chart"), chromedp.NodeVisible))
		require.NoError(t, err)
		parked, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("#messages-section"), chromedp.NodeVisible))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-backlog.png"), chart, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "admin-parked.png"), parked, 0o644))
	}

	// Requeue the first parked message with its button.
	first := parkedIDs[0]
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`tr.parked[data-id="`+first+`"] button.requeue`), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("#flash"))))
	waitText(t, ctx, "#flash", "requeued 1 of 1")
	require.Equal(t, "5", pageText(t, ctx, "#parked-total"))
	f := st.Store.(driver.Finder)
	env, err := f.Find(context.Background(), mustUUID(t, first))
	require.NoError(t, err)
	require.Equal(t, driver.Pending, env.Status, "the store has it pending again")
	require.Zero(t, env.Attempts)

	// Purge one more.
	second := parkedIDs[1]
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`tr.parked[data-id="`+second+`"] button.purge`), chromedp.NodeVisible),
		chromedp.WaitVisible(chromedp.CSS("#flash"))))
	waitText(t, ctx, "#flash", "purged 1 of 1")
	_, err = f.Find(context.Background(), mustUUID(t, second))
	require.ErrorIs(t, err, driver.ErrNotFound)

	// A POST without the form's CSRF token is refused, even with the bearer token.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/requeue", strings.NewReader(url.Values{"all": {"1"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, string(msg), "form token")
	after, err := st.Store.(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, after.Parked, "nothing requeued by the refused POST")
}

func mustUUID(t *testing.T, s string) uuid.UUID {
	t.Helper()
	id, err := uuid.Parse(s)
	require.NoError(t, err)
	return id
}

func TestAdminPageReadOnly(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	srv := serveStore(t, st, adminOptions{})

	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#messages"))))
	require.Zero(t, eval[int](t, ctx, `document.querySelectorAll("form[method=post], button.requeue, button.purge").length`), "a read-only page offers no writes")
	require.Equal(t, "read-only", pageText(t, ctx, ".mode"))
	require.Zero(t, eval[int](t, ctx, `document.querySelectorAll("#stream-cards, #stream-lease").length`), "a store without a stream shows no slot")
	require.Len(t, eval[[]string](t, ctx, `[...document.querySelectorAll("tr.parked")].map(tr => tr.dataset.id)`), 6)

	// A forged form is refused before anything is read from it.
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const f = document.createElement("form"); f.method = "post"; f.action = "/requeue";
		const i = document.createElement("input"); i.name = "all"; i.value = "1"; f.appendChild(i);
		document.body.appendChild(f); setTimeout(() => f.submit(), 0); return true })()`))
	require.NoError(t, err)
	// Wait for the navigation the submit starts (reads fail while it is under way).
	for deadline := time.Now().Add(time.Minute); ; {
		body, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		if err == nil && strings.Contains(body, "read-only: start") {
			break
		}
		require.True(t, time.Now().Before(deadline), "the forged form's answer never showed: %q, %v", body, err)
		time.Sleep(50 * time.Millisecond)
	}
	require.Contains(t, pageText(t, ctx, "body"), "read-only: start outboxctl serve with -allow-writes")
	stats, err := st.Store.(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, stats.Parked, "nothing requeued")
}
