package sqlstore

import "testing"

// SplitBatchesAt makes Enqueue split batches every n rows until the test ends.
func SplitBatchesAt(t testing.TB, n int) {
	rowsPerStatement.Store(int64(n))
	t.Cleanup(func() { rowsPerStatement.Store(0) })
}
