package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
)

// storeList reads every message with status from the store, in list order.
func storeList(t *testing.T, st *openedStore, status driver.Status) []*driver.Envelope {
	t.Helper()
	var out []*driver.Envelope
	require.NoError(t, scan(context.Background(), st.Store.(driver.Admin), status, filter{bucket: -1}, 0, func(e *driver.Envelope) bool {
		out = append(out, e)
		return true
	}))
	return out
}

// rows reads the message list's rows: id, bucket, topic, key, created.
func rows(t *testing.T, ctx context.Context) [][]string {
	t.Helper()
	return eval[[][]string](t, ctx, `[...document.querySelectorAll("tr.message")].map(tr => [tr.dataset.id, tr.dataset.bucket,
		tr.children[1].textContent.trim(), tr.querySelector(".key").textContent.trim(), tr.querySelector(".created").textContent.trim()])`)
}

func TestAdminPagePagesThroughMessages(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	srv := serveStore(t, st, adminOptions{Writes: true, PageSize: 50})
	want := storeList(t, st, driver.Pending)
	require.Len(t, want, 234)

	// Pending, page after page, in the store's order, until there is no next page.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#status-tabs"))))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#status-tabs a[href*="status=pending"]`), chromedp.NodeVisible)))
	waitText(t, ctx, "#status-tabs b", "pending")
	var seen []string
	for page := 1; ; page++ {
		got := rows(t, ctx)
		require.LessOrEqual(t, len(got), 50)
		for _, r := range got {
			seen = append(seen, r[0])
		}
		more := eval[bool](t, ctx, `!!document.querySelector("#next-page")`)
		if !more {
			break
		}
		require.Len(t, got, 50, "a page with a next page is full")
		first := got[0][0]
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#next-page"), chromedp.NodeVisible)))
		// The next page is in when its first row differs.
		waitFor(t, ctx, fmt.Sprintf("page %d", page+1), fmt.Sprintf(`document.querySelector("tr.message")?.dataset.id !== %q`, first))
		require.True(t, eval[bool](t, ctx, `!!document.querySelector("#first-page")`), "a later page links to the first")
	}
	var wantIDs []string
	for _, e := range want {
		wantIDs = append(wantIDs, e.ID.String())
	}
	require.Equal(t, wantIDs, seen, "the pages show every pending message once, in order")

	// Parked is the default list, with its buttons.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#messages"))))
	require.Len(t, rows(t, ctx), 6)
	require.Equal(t, 6, eval[int](t, ctx, `document.querySelectorAll("tr.message button.requeue").length`))
}

func TestAdminPageFilters(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	srv := serveStore(t, st, adminOptions{Writes: true, PageSize: 500})
	pending := storeList(t, st, driver.Pending)
	count := func(f filter) int {
		n := 0
		for _, e := range pending {
			if f.match(e) {
				n++
			}
		}
		return n
	}

	// The filter form: topic and bucket.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?status=pending"), chromedp.WaitVisible(chromedp.CSS("#filters"))))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`#filters input[name=topic]`), "orders", chromedp.NodeVisible),
		chromedp.SetValue(chromedp.CSS(`#filters select[name=bucket]`), "2", chromedp.NodeVisible),
		chromedp.Click(chromedp.CSS("#apply-filters"), chromedp.NodeVisible)))
	waitFor(t, ctx, "the filtered page", `document.querySelector("#clear-filters")`)
	got := rows(t, ctx)
	want := count(filter{topic: "orders", bucket: 2})
	require.Positive(t, want)
	require.Len(t, got, want)
	for _, r := range got {
		require.Equal(t, "2", r[1])
		require.Equal(t, "orders", r[2])
	}
	u, err := url.Parse(eval[string](t, ctx, `location.href`))
	require.NoError(t, err)
	require.Equal(t, "pending", u.Query().Get("status"), "the filters are in the URL: a view can be shared")

	// A key.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?status=pending&key=customer-3"), chromedp.WaitVisible(chromedp.CSS("#messages"))))
	got = rows(t, ctx)
	require.Len(t, got, count(filter{bucket: -1, key: "customer-3"}))
	require.NotEmpty(t, got)
	for _, r := range got {
		require.Equal(t, "customer-3", r[3])
	}

	// Clear, and a link on a topic filters by it.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#clear-filters"), chromedp.NodeVisible)))
	waitFor(t, ctx, "the cleared page", fmt.Sprintf(`!document.querySelector("#clear-filters") && document.querySelectorAll("tr.message").length === %d`, len(pending)))
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr.message a[href*="topic=invoices"]`), chromedp.NodeVisible)))
	waitFor(t, ctx, "the topic's page", fmt.Sprintf(`document.querySelectorAll("tr.message").length === %d`, count(filter{topic: "invoices", bucket: -1})))
	for _, r := range rows(t, ctx) {
		require.Equal(t, "invoices", r[2])
	}

	// "Purge all that match" purges what the filters show, and only that.
	parked := storeList(t, st, driver.Parked)
	topic := parked[0].Topic
	matching := 0
	for _, e := range parked {
		if e.Topic == topic {
			matching++
		}
	}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?topic="+topic), chromedp.WaitVisible(chromedp.CSS("#purge-all"))))
	require.Len(t, rows(t, ctx), matching)
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#purge-all"), chromedp.NodeVisible), chromedp.WaitVisible(chromedp.CSS("#flash"))))
	waitText(t, ctx, "#flash", "purged "+strconv.Itoa(matching)+" of "+strconv.Itoa(matching))
	require.Len(t, storeList(t, st, driver.Parked), len(parked)-matching)
	u, err = url.Parse(eval[string](t, ctx, `location.href`))
	require.NoError(t, err)
	require.Equal(t, topic, u.Query().Get("topic"), "the page keeps its filters after a write")

	// A query the page cannot use says which parameter.
	for q, says := range map[string]string{"bucket=99": "bucket", "status=lost": "status", "after=x": "after", "refresh=-1": "refresh"} {
		resp, err := http.Get(srv.URL + "/?" + q)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
		require.Contains(t, string(body), says+"=", q)
	}
}

func TestAdminPageTimesCarryTheirZone(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	loc, err := time.LoadLocation("Asia/Kolkata") // +05:30, no daylight saving time
	require.NoError(t, err)
	for _, tc := range []struct {
		loc  *time.Location
		zone string
	}{{nil, "UTC"}, {loc, "IST"}} {
		srv := serveStore(t, st, adminOptions{Location: tc.loc})
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#messages"))))
		stamp := regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ` + tc.zone + `$`)
		require.Regexp(t, stamp, pageText(t, ctx, "#sampled"))
		parked := storeList(t, st, driver.Parked)
		for i, r := range rows(t, ctx) {
			require.Regexp(t, stamp, r[4])
			shown, err := time.ParseInLocation("2006-01-02 15:04:05 MST", r[4], func() *time.Location {
				if tc.loc == nil {
					return time.UTC
				}
				return tc.loc
			}())
			require.NoError(t, err)
			require.Equal(t, parked[i].CreatedAt.Truncate(time.Second).Unix(), shown.Unix(), "the time shown is the message's")
		}
	}
}

func TestAdminPageRefreshesItself(t *testing.T) {
	ctx := browser(t)
	st := seedPage(t)
	var gets atomic.Int64
	h, err := newAdminHandler(st, adminOptions{Refresh: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	reloaded := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == "/" && gets.Add(1) > 1 {
			select {
			case reloaded <- r.URL.RawQuery:
			default: // the test has what it needs; the page goes on reloading
			}
		}
	}))
	t.Cleanup(srv.Close)

	// The server's default, and the choices the page offers.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?status=pending&bucket=4"), chromedp.WaitVisible(chromedp.CSS("#refresh"))))
	require.Equal(t, "30 s", pageText(t, ctx, "#refresh b"))
	require.Equal(t, []string{"off", "10 s", "60 s"}, eval[[]string](t, ctx, `[...document.querySelectorAll("#refresh a")].map(a => a.textContent)`))
	require.Regexp(t, `^30; url=/\?bucket=4&status=pending$`, eval[string](t, ctx, `document.querySelector("meta[http-equiv=refresh]").content`))
	// Off is off.
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#refresh a[href*="refresh=0"]`), chromedp.NodeVisible)))
	select {
	case <-reloaded:
	case <-ctx.Done():
		t.Fatalf("the link to turn auto-refresh off led nowhere: %v", ctx.Err())
	}
	waitFor(t, ctx, "the page without auto-refresh", `document.querySelector("#refresh b")?.textContent.trim() === "off"`)
	require.False(t, eval[bool](t, ctx, `!!document.querySelector("meta[http-equiv=refresh]")`))

	// An interval the page does not offer, from the URL, shows as the one in use.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?refresh=45"), chromedp.WaitVisible(chromedp.CSS("#refresh"))))
	require.Equal(t, "45 s", pageText(t, ctx, "#refresh b"))

	// One second: the browser reloads the same view by itself. Every request for
	// refresh=1 after the navigation's own came from the page.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?status=pending&bucket=4&refresh=1")))
	want := url.Values{"status": {"pending"}, "bucket": {"4"}, "refresh": {"1"}}
	for seen := 0; seen < 3; {
		select {
		case q := <-reloaded:
			v, err := url.ParseQuery(q)
			require.NoError(t, err)
			if v.Get("refresh") != "1" {
				continue // a request of the steps before
			}
			require.Equal(t, want, v, "a reload keeps the view")
			seen++
		case <-ctx.Done():
			t.Fatalf("the page did not reload itself: %v", ctx.Err())
		}
	}
}
