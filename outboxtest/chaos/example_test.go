package chaos_test

import (
	"fmt"
	"strings"

	"github.com/outboxkit/outbox/outboxtest/chaos"
)

// A report judges itself: duplicates are a cost, not a failure; a missing message is
// a broken guarantee.
func ExampleReport_Err() {
	rep := chaos.Report{Messages: 100, Committed: 90, RolledBack: 10, Deliveries: 93, Duplicates: 3}
	fmt.Println("with duplicates:", rep.Err())

	rep.Missing = 1
	rep.Problems = []string{"committed message key 4 seq 7 never delivered"}
	first, _, _ := strings.Cut(rep.Err().Error(), "\n")
	fmt.Println("with a loss:", first)
	// Output:
	// with duplicates: <nil>
	// with a loss: chaos: guarantees broken: missing 1, unexpected 0, out of order 0, left over 0:
}
