package main

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
)

//go:embed web
var webFiles embed.FS

var pageTemplate = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"since": func(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() },
	"until": func(now, t time.Time) string { return t.Sub(now).Round(time.Second).String() },
	"seconds": func(s float64) string {
		return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
	},
	"size": size,
	"key": func(k []byte) string {
		if k == nil {
			return ""
		}
		s, _ := text(k)
		return s
	},
}).ParseFS(webFiles, "web/page.html"))

// size shows a byte count in binary units: 512 B, 1.5 KiB, 20.0 MiB.
func size(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, unit := float64(n)/1024, "KiB"
	for _, u := range []string{"MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// timeLayout shows a time with its zone.
const timeLayout = "2006-01-02 15:04:05 MST"

// adminOptions configure the admin page.
type adminOptions struct {
	// Writes allows requeue and purge.
	Writes bool
	// Token, when set, is required as "Authorization: Bearer TOKEN" or in the
	// session cookie that GET /?token=TOKEN sets.
	Token string
	// Hosts are the host names the page answers under besides IP addresses and
	// localhost: a request whose Host header names another is refused, which defeats
	// DNS rebinding (a name the attacker controls, pointed at this address).
	Hosts []string
	// PageSize is how many messages one page of the message list shows (100 when 0).
	PageSize int
	// Refresh is how often the page reloads itself when its URL does not say (0: it
	// does not).
	Refresh time.Duration
	// Location is the zone the page shows times in (UTC when nil).
	Location *time.Location
	Logger   *slog.Logger
}

// scanBudget is how many messages one page reads at most to fill the message list:
// a filter that matches few messages of a large backlog shows what it found and a
// link to read on.
const scanBudget = 20_000

// adminServer serves the admin page over one store.
type adminServer struct {
	st   *openedStore
	adm  driver.Admin
	opts adminOptions
	// csrf is the form token every write must carry.
	csrf string
	// session is the cookie value that proves the token was given: an HMAC of the
	// token under a key this process drew at random, so the cookie is worth nothing
	// to another program (cookies are shared by every port of a host) and nothing
	// after a restart.
	session string
	hosts   map[string]bool
	mux     *http.ServeMux
}

const sessionCookie = "outboxctl_session"

func newAdminHandler(st *openedStore, opts adminOptions) (http.Handler, error) {
	a, err := admin(st)
	if err != nil {
		return nil, err
	}
	var b, key [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 100
	}
	if opts.Location == nil {
		opts.Location = time.UTC
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &adminServer{st: st, adm: a, opts: opts, csrf: hex.EncodeToString(b[:]), hosts: map[string]bool{"localhost": true}, mux: http.NewServeMux()}
	for _, h := range opts.Hosts {
		s.hosts[hostName(h)] = true
	}
	if opts.Token != "" {
		mac := hmac.New(sha256.New, key[:])
		mac.Write([]byte("outboxctl session\x00" + opts.Token))
		s.session = hex.EncodeToString(mac.Sum(nil))
	}
	static, _ := fs.Sub(webFiles, "web")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.HandleFunc("POST /requeue", s.write("requeued", a.Requeue))
	s.mux.HandleFunc("POST /purge", s.write("purged", a.Purge))
	return s, nil
}

func (s *adminServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// The page's own forms then carry Origin (and Referer), which writes require;
	// other sites get neither from this page.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if !s.hostAllowed(r.Host) {
		s.opts.Logger.Warn("outboxctl serve: refused a request for another host name", "host", r.Host, "remote", r.RemoteAddr)
		http.Error(w, fmt.Sprintf("refused: this page is not served under the host name %q (it answers IP addresses, localhost and the names given with -host)", r.Host), http.StatusForbidden)
		return
	}
	if s.opts.Token != "" {
		if r.Method == http.MethodGet && r.URL.Path == "/" && r.URL.Query().Has("token") {
			if !equal(r.URL.Query().Get("token"), s.opts.Token) {
				http.Error(w, "wrong token", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.session, Path: "/", HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="outboxctl"`)
			http.Error(w, "unauthorized: send Authorization: Bearer TOKEN, or open /?token=TOKEN once", http.StatusUnauthorized)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (s *adminServer) authorized(r *http.Request) bool {
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(auth, s.opts.Token) {
		return true
	}
	c, err := r.Cookie(sessionCookie)
	return err == nil && equal(c.Value, s.session)
}

// hostName is the name in a Host header or a -host value: without a port or
// brackets, in lower case, without a trailing dot.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// hostAllowed reports whether a request's Host may be served: an IP address (no
// name, so nothing to rebind), localhost, or a configured name.
func (s *adminServer) hostAllowed(host string) bool {
	name := hostName(host)
	if name == "" {
		return false
	}
	return net.ParseIP(name) != nil || s.hosts[name]
}

// sameOrigin returns why a write does not come from the page's own origin, or nil.
// Browsers send Origin with every POST; when it is absent, Referer stands in.
// "null" (a sandboxed frame, a page that sends no referrer, a redirect from
// elsewhere), anything else that is not this Host, or neither header at all is
// refused. Host itself is one of the page's names (see hostAllowed), so a page
// under a rebound name fails before this.
func sameOrigin(r *http.Request) error {
	from, header := r.Header.Get("Origin"), "Origin"
	if from == "" {
		from, header = r.Header.Get("Referer"), "Referer"
	}
	switch from {
	case "":
		return errors.New("no Origin or Referer header says where the request comes from")
	case "null":
		return fmt.Errorf("%s: null (a sandboxed frame, or a page on another origin)", header)
	}
	u, err := url.Parse(from)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) || (r.TLS != nil && u.Scheme != "https") {
		return fmt.Errorf("%s: %q is not this page's origin", header, from)
	}
	return nil
}

// chart is the SVG bar chart of the backlog.
type chart struct {
	Width, Height, Left, Base, LabelY int
	Max                               int
	Bars                              []bar
}

type bar struct {
	Bucket, Pending            int
	X, Y, W, H, LabelX, CountY int
}

func newChart(pending []int) chart {
	c := chart{Width: 720, Height: 200, Left: 48, Base: 170, LabelY: 188}
	c.Max = 1
	for _, n := range pending {
		c.Max = max(c.Max, n)
	}
	n := max(len(pending), 1)
	slot := (c.Width - c.Left - 8) / n
	w := max(slot*7/10, 1)
	for b, p := range pending {
		h := (c.Base - 20) * p / c.Max
		x := c.Left + 4 + b*slot + (slot-w)/2
		c.Bars = append(c.Bars, bar{Bucket: b, Pending: p, X: x, Y: c.Base - h, W: w, H: h, LabelX: x + w/2, CountY: c.Base - h - 4})
	}
	return c
}

type pageData struct {
	Kind         string
	Buckets      int
	Now          time.Time
	Stats        statsView
	OldestAge    string
	Chart        chart
	Leases       leasesView
	ActiveRelays int
	Query        listQuery
	List         listPage
	Statuses     []string
	Refreshes    []int
	Writes       bool
	CSRF         string
	Flash, Error string
	// loc is the zone times are shown in.
	loc *time.Location
}

// At shows a time in the page's zone, with the zone; the zero time is "".
func (d pageData) At(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.In(d.loc).Format(timeLayout)
}

func (s *adminServer) page(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := time.Now()
	q, err := parseListQuery(r.URL.Query(), s.st.BucketCount(), int(s.opts.Refresh/time.Second))
	if err != nil {
		http.Error(w, "bad query: "+err.Error(), http.StatusBadRequest)
		return
	}
	d := pageData{Kind: s.st.Kind, Buckets: s.st.BucketCount(), Now: now, Writes: s.opts.Writes, CSRF: s.csrf, Query: q,
		Statuses: []string{"parked", "pending", "dispatched"}, Refreshes: refreshChoices(q),
		Flash: r.URL.Query().Get("done"), Error: r.URL.Query().Get("error"), loc: s.opts.Location}
	st, err := s.adm.Stats(ctx)
	if err != nil {
		s.fail(w, "reading the backlog", err)
		return
	}
	d.Stats = newStatsView(st, now)
	d.OldestAge = "none"
	if !st.OldestPending.IsZero() {
		d.OldestAge = time.Duration(d.Stats.OldestPendingAge * float64(time.Second)).Round(time.Second).String()
	}
	d.Chart = newChart(st.Pending)
	leases, view, err := readLeases(ctx, s.st, now)
	if err != nil {
		s.fail(w, "reading the leases", err)
		return
	}
	d.Leases = leases
	for _, rl := range view.Relays {
		if !rl.Stopped() && now.Sub(rl.LastSeen) < time.Minute {
			d.ActiveRelays++
		}
	}
	d.List, err = scanPage(ctx, s.adm, q.Status, q.filter(), q.After, s.opts.PageSize, scanBudget)
	if err != nil {
		s.fail(w, "listing "+q.StatusName()+" messages", err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pageTemplate.Execute(w, d); err != nil {
		s.opts.Logger.Warn("outboxctl serve: rendering the page", "error", err)
	}
}

// refreshChoices are the reload intervals the page offers: off, 10, 30 and 60 s, the
// server's default and the one in use.
func refreshChoices(q listQuery) []int {
	out := []int{0, 10, 30, 60}
	for _, n := range []int{q.defRefresh, q.Refresh} {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func (s *adminServer) fail(w http.ResponseWriter, what string, err error) {
	s.opts.Logger.Warn("outboxctl serve: "+what, "error", err)
	http.Error(w, what+": "+err.Error(), http.StatusBadGateway)
}

// write handles a requeue or purge form.
func (s *adminServer) write(verb string, op func(context.Context, ...uuid.UUID) (int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.opts.Writes {
			http.Error(w, "read-only: start outboxctl serve with -allow-writes to requeue or purge", http.StatusForbidden)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !equal(r.PostForm.Get("csrf"), s.csrf) {
			http.Error(w, "missing or stale form token: reload the page and try again", http.StatusForbidden)
			return
		}
		if err := sameOrigin(r); err != nil {
			s.opts.Logger.Warn("outboxctl serve: refused a write from another origin", "error", err, "remote", r.RemoteAddr)
			http.Error(w, "cross-origin request refused: "+err.Error(), http.StatusForbidden)
			return
		}
		ctx := r.Context()
		var ids []uuid.UUID
		for _, v := range r.PostForm["id"] {
			id, err := uuid.Parse(v)
			if err != nil {
				http.Error(w, fmt.Sprintf("%q is not a message ID", v), http.StatusBadRequest)
				return
			}
			ids = append(ids, id)
		}
		// "All" acts on every parked message the list's filters match.
		back, err := parseListQuery(r.PostForm, s.st.BucketCount(), 0)
		if err != nil {
			http.Error(w, "bad form: "+err.Error(), http.StatusBadRequest)
			return
		}
		back.Status, back.HasAfter = driver.Parked, false
		if r.PostForm.Get("all") == "1" {
			err := scan(ctx, s.adm, driver.Parked, back.filter(), 0, func(e *driver.Envelope) bool {
				ids = append(ids, e.ID)
				return true
			})
			if err != nil {
				s.fail(w, "listing parked messages", err)
				return
			}
		}
		if len(ids) == 0 {
			http.Error(w, "nothing selected: send id=… or all=1", http.StatusBadRequest)
			return
		}
		done := 0
		for i := 0; i < len(ids); i += batchSize {
			n, err := op(context.WithoutCancel(ctx), ids[i:min(i+batchSize, len(ids))]...)
			done += n
			if err != nil {
				s.opts.Logger.Warn("outboxctl serve: "+verb, "error", err, "done", done)
				v := back.values()
				v.Set("error", fmt.Sprintf("%s %d of %d, then: %v", verb, done, len(ids), err))
				http.Redirect(w, r, pageURL(v), http.StatusSeeOther)
				return
			}
		}
		s.opts.Logger.Info("outboxctl serve: "+verb, "messages", done, "remote", r.RemoteAddr)
		v := back.values()
		v.Set("done", fmt.Sprintf("%s %d of %d", verb, done, len(ids)))
		http.Redirect(w, r, pageURL(v), http.StatusSeeOther)
	}
}

// hostList is a repeatable flag; one value may also list names separated by commas
// (as OUTBOX_HOST does).
type hostList []string

func (h *hostList) String() string { return strings.Join(*h, ",") }

func (h *hostList) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		n := hostName(name)
		if n == "" || strings.ContainsAny(name, "/@?# ") || (strings.Contains(n, ":") && net.ParseIP(n) == nil) {
			return fmt.Errorf("%q is not a host name (admin.example.com)", name)
		}
		*h = append(*h, n)
	}
	return nil
}

func cmdServe(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("serve", "[-listen ADDR] [-allow-writes] [-token T] [-host NAME]…")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on; beyond loopback, -allow-writes needs -token")
	writes := fs.Bool("allow-writes", false, "allow requeue and purge from the page; default read-only")
	token := fs.String("token", "", "require this bearer token (Authorization: Bearer T, or open /?token=T once); prefer OUTBOX_TOKEN to keep it out of the process list; default none")
	var hosts hostList
	fs.Var(&hosts, "host", "a host name the page is reached by (a DNS name of this host, a proxy's); repeat it for more. IP addresses, localhost and -listen's name are always accepted; requests naming any other host are refused")
	limit := fs.Int("page-size", 100, "messages per page of the page's message list")
	refresh := fs.Duration("refresh", 0, "how often the page reloads itself unless its URL says (the page offers 10 s, 30 s, 60 s); 0 for never")
	zone := fs.String("time-zone", "UTC", "the zone the page shows times in: UTC, Local, or an IANA name (Europe/Berlin)")
	var loc *time.Location
	var ln net.Listener
	defer func() {
		if ln != nil {
			_ = ln.Close()
		}
	}()
	// Everything the flags decide is checked, and the address bound, before the
	// store is opened: a refused start leaves nothing behind.
	prepare := func() error {
		if err := c.noArgs("serve")(); err != nil {
			return err
		}
		if *limit <= 0 {
			return fmt.Errorf("%w: -page-size %d: give 1 or more", errUsage, *limit)
		}
		if *refresh < 0 || (*refresh > 0 && *refresh < time.Second) || *refresh > time.Hour {
			return fmt.Errorf("%w: -refresh %s: give 0 (never) or 1s to 1h", errUsage, *refresh)
		}
		var err error
		if loc, err = time.LoadLocation(*zone); err != nil {
			return fmt.Errorf("%w: -time-zone %q: %v", errUsage, *zone, err)
		}
		host, _, err := net.SplitHostPort(*listen)
		if err != nil {
			return fmt.Errorf("%w: -listen %q: give HOST:PORT (127.0.0.1:8080, or :8080 for every interface): %v", errUsage, *listen, err)
		}
		if host != "" && net.ParseIP(host) == nil {
			hosts = append(hosts, hostName(host))
		}
		if ln, err = net.Listen("tcp", *listen); err != nil {
			return fmt.Errorf("%w: -listen %s: %v", errUsage, *listen, err)
		}
		if loopback(ln.Addr()) || *token != "" {
			return nil
		}
		if *writes {
			return fmt.Errorf("%w: -allow-writes with -listen %s, which is beyond loopback, needs -token (or OUTBOX_TOKEN): without one anyone who reaches the address could requeue and purge; set -token, or listen on 127.0.0.1",
				errUsage, *listen)
		}
		return nil
	}
	return c.withStore(ctx, fs, args, prepare, func(st *openedStore) error {
		log := slog.New(slog.NewTextHandler(c.stderr, nil))
		h, err := newAdminHandler(st, adminOptions{Writes: *writes, Token: *token, Hosts: hosts, PageSize: *limit, Refresh: *refresh, Location: loc, Logger: log})
		if err != nil {
			return err
		}
		if *token == "" && !loopback(ln.Addr()) {
			log.Warn("outboxctl serve: listening beyond loopback without -token: anyone who reaches the address can read the outbox")
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		fmt.Fprintf(c.stdout, "serving the admin page on http://%s/ (%s)\n", ln.Addr(), map[bool]string{true: "writes allowed", false: "read-only"}[*writes])
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
		}
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(shut); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
}

// loopback reports whether a bound address is a loopback one.
func loopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}
