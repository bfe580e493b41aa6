// Package hooks holds the test hooks of package sqlstore: values its tests set to
// reach code paths that would otherwise need very large inputs. Production code
// never sets them; their zero values change nothing.
package hooks

import "sync/atomic"

// RowsPerStatement, when positive, caps the rows one INSERT of Enqueue writes, so
// splitting a batch into several statements is exercised without binding tens of
// thousands of parameters.
var RowsPerStatement atomic.Int64

// IdleWindow, when positive, replaces how often (in nanoseconds) a store on a *sql.DB
// reads the pool's count of connections closed for want of idle room, so the
// warning is exercised without waiting half a minute.
var IdleWindow atomic.Int64
