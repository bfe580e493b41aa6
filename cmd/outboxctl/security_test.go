package main

import (
	"context"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
)

// The attacks below run in the default set-up an operator gets from
// "outboxctl serve -allow-writes": loopback, no token. Each attacker is assumed to
// know the form token (it is the same for every visitor of one process, so it
// leaks with a screenshot, a saved page or a proxy log): the Host and Origin checks
// must hold on their own.

// served is one request the admin handler answered.
type served struct {
	method, path, host, origin, referer string
	status                              int
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

// serveWatched serves the admin page and reports every POST it answered, so a test
// knows that an attack reached the server and what it got.
func serveWatched(t *testing.T, st *openedStore, opts adminOptions) (*httptest.Server, <-chan served) {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := newAdminHandler(st, opts)
	require.NoError(t, err)
	posts := make(chan served, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		if r.Method == http.MethodPost {
			posts <- served{method: r.Method, path: r.URL.Path, host: r.Host, origin: r.Header.Get("Origin"),
				referer: r.Header.Get("Referer"), status: rec.status}
		}
	}))
	t.Cleanup(srv.Close)
	return srv, posts
}

// nextPost waits for the next POST the server answered (the browser's deadline
// bounds the wait).
func nextPost(t *testing.T, ctx context.Context, posts <-chan served) served {
	t.Helper()
	select {
	case p := <-posts:
		return p
	case <-ctx.Done():
		t.Fatalf("the attack never reached the server: %v", ctx.Err())
	}
	return served{}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// formToken reads the page's form token and its parked messages as the operator's
// own browser sees them.
func formToken(t *testing.T, ctx context.Context, base string) (string, []string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("tr.parked"))))
	page := eval[string](t, ctx, `document.documentElement.outerHTML`)
	m := csrfField.FindStringSubmatch(page)
	require.NotNil(t, m, "the page of a server with writes carries a form token")
	ids := eval[[]string](t, ctx, `[...document.querySelectorAll("tr.parked")].map(tr => tr.dataset.id)`)
	require.NotEmpty(t, ids)
	return m[1], ids
}

func requireStatus(t *testing.T, st *openedStore, id string, want driver.Status) {
	t.Helper()
	env, err := st.Store.(driver.Finder).Find(context.Background(), mustUUID(t, id))
	require.NoError(t, err, "message %s", id)
	require.Equal(t, want, env.Status, "message %s", id)
}

func TestAdminPageRefusesDNSRebinding(t *testing.T) {
	// A name the attacker controls, resolving to this machine's loopback address.
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"))
	st := seedPage(t)
	srv, posts := serveWatched(t, st, adminOptions{Writes: true})
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	csrf, ids := formToken(t, ctx, srv.URL)
	victim := ids[0]

	// The attacker's page, at http://rebind.test:PORT, once its name points here:
	// its script reads the admin page and posts a purge, both same-origin for the
	// browser.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("http://rebind.test:"+port+"/")))
	result := eval2[[]int](t, ctx, fmt.Sprintf(`(async () => {
		const page = await fetch("/");
		const write = await fetch("/purge", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"},
			body: new URLSearchParams({csrf: %q, id: %q})});
		return [page.status, write.status];
	})()`, csrf, victim))
	got := nextPost(t, ctx, posts)
	require.Equal(t, "rebind.test:"+port, got.host)
	require.Equal(t, http.StatusForbidden, got.status, "a write under a rebound host name is refused")
	require.Equal(t, http.StatusForbidden, result[0], "so is reading the page under it")
	require.Equal(t, http.StatusForbidden, result[1])
	requireStatus(t, st, victim, driver.Parked)

	// The page under its own address, and under localhost, still works.
	for _, base := range []string{srv.URL, "http://localhost:" + port} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("tr.parked"))))
		id := eval[string](t, ctx, `document.querySelector("tr.parked").dataset.id`)
		require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr.parked[data-id="`+id+`"] button.requeue`), chromedp.NodeVisible)))
		own := nextPost(t, ctx, posts)
		require.Equal(t, http.StatusSeeOther, own.status, "the page's own requeue button at %s", base)
		waitText(t, ctx, "#flash", "requeued 1 of 1")
		requireStatus(t, st, id, driver.Pending)
	}
}

func TestAdminPageRefusesSandboxedFrames(t *testing.T) {
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP attacker.test 127.0.0.1"))
	st := seedPage(t)
	srv, posts := serveWatched(t, st, adminOptions{Writes: true})
	csrf, ids := formToken(t, ctx, srv.URL)
	victim := ids[0]

	// A page on another site frames a sandboxed document (an opaque origin: its
	// requests say "Origin: null") that posts the purge form.
	frame := fmt.Sprintf(`<form method="post" action="%s/purge"><input name="csrf" value="%s"><input name="id" value="%s"></form>`+
		`<script>document.forms[0].submit()</script>`, srv.URL, csrf, victim)
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>cats</title><iframe sandbox="allow-forms allow-scripts" srcdoc="%s"></iframe>`, html.EscapeString(frame))
	}))
	t.Cleanup(attacker.Close)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(strings.Replace(attacker.URL, "127.0.0.1", "attacker.test", 1)+"/")))

	got := nextPost(t, ctx, posts)
	require.Equal(t, "null", got.origin, "a sandboxed frame posts with Origin: null")
	require.Equal(t, http.StatusForbidden, got.status, "and is refused")
	requireStatus(t, st, victim, driver.Parked)
}

func TestAdminPageRefusesFormsFromOtherOrigins(t *testing.T) {
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP attacker.test 127.0.0.1"))
	st := seedPage(t)
	srv, posts := serveWatched(t, st, adminOptions{Writes: true})
	csrf, ids := formToken(t, ctx, srv.URL)

	// A page on another origin that auto-submits the purge form; with
	// Referrer-Policy: no-referrer the browser sends "Origin: null", without it
	// the page's origin.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("policy") != "" {
			w.Header().Set("Referrer-Policy", r.URL.Query().Get("policy"))
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>win a prize</title><form method="post" action="%s/purge">`+
			`<input name="csrf" value="%s"><input name="id" value="%s"></form><script>document.forms[0].submit()</script>`,
			srv.URL, csrf, html.EscapeString(r.URL.Query().Get("id")))
	}))
	t.Cleanup(attacker.Close)
	page := strings.Replace(attacker.URL, "127.0.0.1", "attacker.test", 1)

	for i, tc := range []struct{ policy, origin string }{
		{"no-referrer", "null"},
		{"", page},
	} {
		victim := ids[i]
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page+"/?"+url.Values{"policy": {tc.policy}, "id": {victim}}.Encode())))
		got := nextPost(t, ctx, posts)
		require.Equal(t, tc.origin, got.origin, "policy %q", tc.policy)
		require.Equal(t, http.StatusForbidden, got.status, "a form from %s is refused", tc.origin)
		requireStatus(t, st, victim, driver.Parked)
	}
}

// eval2 evaluates a script that returns a promise, and its result.
func eval2[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "%s", js)
	return v
}

// post sends a form as a script would, with the headers given.
func post(t *testing.T, srv *httptest.Server, path string, form url.Values, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// pageToken reads the form token over plain HTTP.
func pageToken(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	m := csrfField.FindStringSubmatch(string(body))
	require.NotNil(t, m)
	return m[1]
}

func TestAdminWritesNeedThePagesOrigin(t *testing.T) {
	st := seedPage(t)
	srv, _ := serveWatched(t, st, adminOptions{Writes: true})
	csrf := pageToken(t, srv)
	parked, err := st.Store.(driver.Admin).List(context.Background(), driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	own := srv.URL // http://127.0.0.1:PORT
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    int
		says    string
	}{
		{"neither Origin nor Referer", nil, http.StatusForbidden, "no Origin or Referer"},
		{"Origin null", map[string]string{"Origin": "null"}, http.StatusForbidden, "null"},
		{"another Origin", map[string]string{"Origin": "http://attacker.test"}, http.StatusForbidden, "not this page's origin"},
		{"another port", map[string]string{"Origin": "http://127.0.0.1:1"}, http.StatusForbidden, "not this page's origin"},
		{"a Referer elsewhere", map[string]string{"Referer": "http://attacker.test/x"}, http.StatusForbidden, "Referer"},
		{"the page's Referer", map[string]string{"Referer": own + "/?topic=orders"}, http.StatusSeeOther, ""},
		{"the page's Origin", map[string]string{"Origin": own}, http.StatusSeeOther, ""},
		{"the page's Origin, another Referer", map[string]string{"Origin": own, "Referer": "http://attacker.test/"}, http.StatusSeeOther, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := st.Store.(driver.Admin).Stats(context.Background())
			require.NoError(t, err)
			id := parked[len(parked)-1]
			code, body := post(t, srv, "/requeue", url.Values{"csrf": {csrf}, "id": {id.ID.String()}}, tc.headers)
			require.Equal(t, tc.want, code, body)
			require.Contains(t, body, tc.says)
			after, err := st.Store.(driver.Admin).Stats(context.Background())
			require.NoError(t, err)
			if tc.want == http.StatusForbidden {
				require.Equal(t, before.Parked, after.Parked, "nothing requeued")
			} else {
				require.Equal(t, before.Parked-1, after.Parked, "requeued")
				parked = parked[:len(parked)-1]
			}
		})
	}
}

func TestAdminPageAnswersOnlyItsHostNames(t *testing.T) {
	st := seedPage(t)
	srv, _ := serveWatched(t, st, adminOptions{Writes: true})
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	get := func(host string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST.:" + port, "[::1]:" + port, "10.1.2.3"} {
		require.Equal(t, http.StatusOK, get(host), "Host %s", host)
	}
	for _, host := range []string{"rebind.test:" + port, "localhost.attacker.test:" + port, "127.0.0.1.nip.test:" + port} {
		require.Equal(t, http.StatusForbidden, get(host), "Host %s", host)
	}
	csrf := pageToken(t, srv)
	code, body := post(t, srv, "/purge", url.Values{"csrf": {csrf}, "all": {"1"}}, map[string]string{"Host": "rebind.test:" + port, "Origin": "http://rebind.test:" + port})
	require.Equal(t, http.StatusForbidden, code, body)
	stats, err := st.Store.(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, stats.Parked, "nothing purged")
}

func TestAdminSessionCookieIsNotTheToken(t *testing.T) {
	st := seedPage(t)
	const token = "s3cret-token"
	srv, _ := serveWatched(t, st, adminOptions{Writes: true, Token: token})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(srv.URL + "/?token=" + token)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	cookies := resp.Cookies()
	require.Len(t, cookies, 1)
	session := cookies[0]
	require.NotContains(t, session.Value, token, "the cookie does not carry the token")
	require.True(t, session.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, session.SameSite)

	withCookie := func(c *http.Cookie) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.AddCookie(c)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, withCookie(session), "the session cookie opens the page")
	require.Equal(t, http.StatusUnauthorized, withCookie(&http.Cookie{Name: session.Name, Value: token}), "the raw token as a cookie does not")

	// Another process with the same token (a restart) issues another cookie.
	other, _ := serveWatched(t, st, adminOptions{Writes: true, Token: token})
	resp, err = client.Get(other.URL + "/?token=" + token)
	require.NoError(t, err)
	resp.Body.Close()
	require.NotEqual(t, session.Value, resp.Cookies()[0].Value)
}

// withoutOrigin makes the browser send its writes to base without Origin, as an
// older browser or a proxy that strips it would: the server then has only Referer
// to go by.
func withoutOrigin(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	paused := chromedp.Events(ctx, fetch.RequestPaused)
	_, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
		{URLPattern: base + "/requeue*"}, {URLPattern: base + "/purge*"}}})
	require.NoError(t, err)
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			var headers []*fetch.HeaderEntry
			for k, v := range ev.Request.Headers {
				if strings.EqualFold(k, "Origin") {
					continue
				}
				headers = append(headers, &fetch.HeaderEntry{Name: k, Value: fmt.Sprint(v)})
			}
			if _, err := chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID, Headers: headers}); err != nil {
				return
			}
		}
	}()
}

func TestAdminWritesWithoutOriginFallBackToReferer(t *testing.T) {
	ctx := browser(t, chromedp.Flag("host-resolver-rules", "MAP attacker.test 127.0.0.1"))
	st := seedPage(t)
	srv, posts := serveWatched(t, st, adminOptions{Writes: true})
	csrf, ids := formToken(t, ctx, srv.URL)
	withoutOrigin(t, ctx, srv.URL)

	// The page's own button: its Referer is the page (Referrer-Policy: same-origin).
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr.parked[data-id="`+ids[0]+`"] button.requeue`), chromedp.NodeVisible)))
	own := nextPost(t, ctx, posts)
	require.Empty(t, own.origin, "the browser sent no Origin")
	require.True(t, strings.HasPrefix(own.referer, srv.URL+"/"), "Referer %q", own.referer)
	require.Equal(t, http.StatusSeeOther, own.status, "the page's own write, known by its Referer")
	waitText(t, ctx, "#flash", "requeued 1 of 1")
	requireStatus(t, st, ids[0], driver.Pending)

	// Another origin's form: its Referer is that origin, or, with no-referrer, absent.
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Query().Get("policy"); p != "" {
			w.Header().Set("Referrer-Policy", p)
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>win a prize</title><form method="post" action="%s/purge">`+
			`<input name="csrf" value="%s"><input name="id" value="%s"></form><script>document.forms[0].submit()</script>`,
			srv.URL, csrf, html.EscapeString(r.URL.Query().Get("id")))
	}))
	t.Cleanup(attacker.Close)
	page := strings.Replace(attacker.URL, "127.0.0.1", "attacker.test", 1)
	for i, tc := range []struct{ policy, referer, says string }{
		{"", page + "/", "Referer: \"" + page + "/\" is not this page's origin"},
		{"no-referrer", "", "no Origin or Referer header"},
	} {
		victim := ids[i+1]
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page+"/?"+url.Values{"policy": {tc.policy}, "id": {victim}}.Encode())))
		got := nextPost(t, ctx, posts)
		require.Empty(t, got.origin)
		require.Equal(t, tc.referer, got.referer, "policy %q", tc.policy)
		require.Equal(t, http.StatusForbidden, got.status, "a form from another origin without Origin, Referer %q, is refused", got.referer)
		waitFor(t, ctx, "the refusal", fmt.Sprintf(`document.body.innerText.includes(%q)`, tc.says))
		requireStatus(t, st, victim, driver.Parked)
	}
}
