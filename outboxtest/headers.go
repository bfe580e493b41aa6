package outboxtest

import (
	"fmt"

	"github.com/outboxkit/outbox"
)

// AwkwardHeaders returns headers that a transport packing or translating headers
// must carry unchanged: empty and nil values, every byte value, CR and LF, blanks at
// the edges, non-ASCII names, repeated names out of order, a name with a colon, and
// 300 more. A transport's test appends the names its own format reserves.
func AwkwardHeaders() []outbox.Header {
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	hs := []outbox.Header{
		{Key: "empty", Value: []byte{}},
		{Key: "nil", Value: nil},
		{Key: "binary", Value: every},
		{Key: "ключ", Value: []byte("значение ✓")},
		{Key: "名前", Value: []byte{}},
		{Key: "dup", Value: []byte("2")},
		{Key: "crlf", Value: []byte("a\r\nb: c")},
		{Key: "dup", Value: []byte("1")},
		{Key: " blank-edged ", Value: []byte("  v\t")},
		{Key: "with:colon", Value: []byte("v")},
	}
	for i := range 300 {
		hs = append(hs, outbox.Header{Key: fmt.Sprintf("h-%03d-ü", i), Value: fmt.Appendf(nil, "%d", i)})
	}
	return hs
}
