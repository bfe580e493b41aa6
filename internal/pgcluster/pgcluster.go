// Package pgcluster starts a PostgreSQL cluster of a test's own: initdb into a
// temporary directory, pg_ctl start on a free port of 127.0.0.1 with the settings
// the test asks for (wal_level=logical, say), and pg_ctl stop with the directory
// removed when the test ends. It never touches another server.
//
// The PostgreSQL programs are found at run time: the directory pg_config --bindir
// names, else initdb on PATH, else the newest /usr/lib/postgresql/N/bin (the Debian
// and Ubuntu layout). A missing program fails the test under CI=true and skips it
// elsewhere. PostgreSQL refuses to run as root: run as root, the cluster runs as the
// operating system user "postgres", which must exist.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is a running PostgreSQL cluster of the test's own.
type Cluster struct {
	bin     string
	dir     string // holds data/, the log and the socket
	port    int
	options []string
	cred    *syscall.Credential

	mu      sync.Mutex
	running bool
}

// Options are the server settings of a cluster, as name=value pairs given to
// postgres -c.
type Options []string

// Logical is what the log mode needs: logical decoding, and room for slots and
// WAL senders.
var Logical = Options{"wal_level=logical", "max_replication_slots=16", "max_wal_senders=16"}

// Start starts a cluster with opts for the test and stops it, removing its files,
// when the test ends.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(opts)
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(c.Remove)
	return c
}

// ErrNoPostgres is wrapped by New when the PostgreSQL programs cannot be found or
// cannot run.
var ErrNoPostgres = errors.New("pgcluster: PostgreSQL programs not available")

// New initialises and starts a cluster with opts; Remove stops it and removes its
// files. Tests use Start; New is for a TestMain that shares one cluster.
func New(opts Options) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, options: append([]string(nil), opts...)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: running as root, the cluster needs the operating system user postgres: %v", ErrNoPostgres, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "outbox-pgcluster-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	if c.cred != nil {
		// The server's user must reach its directory.
		err := os.Chmod(dir, 0o755)
		if err == nil {
			err = os.Chown(dir, int(c.cred.Uid), int(c.cred.Gid))
		}
		if err != nil {
			c.Remove()
			return nil, err
		}
	}
	if out, err := c.run("initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		c.Remove()
		return nil, fmt.Errorf("pgcluster: initdb: %w: %s", err, out)
	}
	// Another process may take the free port before the server binds it: try a few.
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			c.Remove()
			return nil, err
		}
		c.port = port
		err = c.Restart()
		if err == nil {
			return c, nil
		}
		if attempt == 2 {
			c.Remove()
			return nil, err
		}
	}
}

// URL is a connection URL for database, as user postgres.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, database)
}

// Port is the cluster's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Stop stops the server with pg_ctl's mode: "fast" is a clean shutdown, "immediate"
// one without a checkpoint, as a crash would leave it (the next start recovers).
func (c *Cluster) Stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	out, err := c.run("pg_ctl", "stop", "-D", c.data(), "-m", mode, "-w", "-t", "120")
	if err != nil {
		return fmt.Errorf("pgcluster: pg_ctl stop -m %s: %w: %s", mode, err, out)
	}
	c.running = false
	return nil
}

// Restart starts the server again after a Stop, on the same port and data.
func (c *Cluster) Restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	settings := []string{"-p", strconv.Itoa(c.port), "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + c.dir}
	for _, o := range c.options {
		settings = append(settings, "-c", o)
	}
	out, err := c.run("pg_ctl", "start", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "120", "-o", strings.Join(settings, " "))
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		return fmt.Errorf("pgcluster: pg_ctl start: %w: %s\n%s", err, out, log)
	}
	c.running = true
	return nil
}

// Remove stops the server (fast) and removes the cluster's files.
func (c *Cluster) Remove() {
	_ = c.Stop("fast")
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// run runs one of the PostgreSQL programs, as the server's user, with a deadline of
// its own: pg_ctl is given -t, initdb takes seconds.
func (c *Cluster) run(program string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, program), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// binDir finds the directory of initdb and pg_ctl.
func binDir() (string, error) {
	has := func(dir string) bool {
		for _, p := range []string{"initdb", "pg_ctl", "postgres"} {
			if st, err := os.Stat(filepath.Join(dir, p)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); has(dir) {
				return dir, nil
			}
		}
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(initdb); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(initdb)) {
			return filepath.Dir(initdb), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w: no pg_config --bindir, initdb on PATH or /usr/lib/postgresql/N/bin holds initdb, pg_ctl and postgres", ErrNoPostgres)
}

func version(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// unavailable fails the test under CI=true, where PostgreSQL must be installed, and
// skips it elsewhere.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" || !errors.Is(err, ErrNoPostgres) {
		tb.Fatalf("a PostgreSQL cluster of the test's own is required: %v", err)
	}
	tb.Skipf("PostgreSQL programs are not available (%v); install PostgreSQL 14 or later to run this test", err)
}
