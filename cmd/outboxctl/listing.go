package main

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/driver"
)

// listQuery is what the admin page's message list shows: its filters, where the page
// starts, and how often the page reloads itself. It travels in the page's URL.
type listQuery struct {
	Status driver.Status
	Topic  string
	// Bucket is -1 for every bucket.
	Bucket int
	// Key matches a message's key as the page shows it (its text, or base64 when it is
	// not UTF-8); empty matches every key.
	Key string
	// After is where the page starts: after this bucket and sequence number.
	After    driver.Cursor
	HasAfter bool
	// Refresh is the reload interval in seconds; 0 is off. defRefresh is the
	// server's, which URLs leave out.
	Refresh, defRefresh int
}

// StatusName is the status as the URL and the page name it.
func (q listQuery) StatusName() string { return q.Status.String() }

// Parked reports whether the list shows parked messages (which have buttons).
func (q listQuery) Parked() bool { return q.Status == driver.Parked }

// Filtered reports whether a filter other than the status is set.
func (q listQuery) Filtered() bool { return q.Topic != "" || q.Bucket >= 0 || q.Key != "" }

func (q listQuery) filter() filter { return filter{topic: q.Topic, bucket: q.Bucket, key: q.Key} }

// values encodes the query without the page's start.
func (q listQuery) values() url.Values {
	v := url.Values{}
	if q.Status != driver.Parked {
		v.Set("status", q.StatusName())
	}
	if q.Topic != "" {
		v.Set("topic", q.Topic)
	}
	if q.Bucket >= 0 {
		v.Set("bucket", strconv.Itoa(q.Bucket))
	}
	if q.Key != "" {
		v.Set("key", q.Key)
	}
	if q.Refresh != q.defRefresh {
		v.Set("refresh", strconv.Itoa(q.Refresh))
	}
	return v
}

// URL is the page with this query, starting at its first page.
func (q listQuery) URL() string { return pageURL(q.values()) }

// Here is the page with this query and its start: what auto-refresh reloads.
func (q listQuery) Here() string {
	v := q.values()
	if q.HasAfter {
		v.Set("after", formatCursor(q.After))
	}
	return pageURL(v)
}

// With is the page with this query, another status and the first page.
func (q listQuery) With(status string) string {
	v := q.values()
	v.Del("status")
	if status != driver.Parked.String() {
		v.Set("status", status)
	}
	return pageURL(v)
}

// Clear is the page of the query's status without filters.
func (q listQuery) Clear() string {
	return listQuery{Status: q.Status, Bucket: -1, Refresh: q.Refresh, defRefresh: q.defRefresh}.URL()
}

// WithTopic is the page of the query's status filtered by one topic.
func (q listQuery) WithTopic(topic string) string {
	v := q.values()
	v.Set("topic", topic)
	return pageURL(v)
}

// WithRefresh is the page with another reload interval (0: off).
func (q listQuery) WithRefresh(seconds int) string {
	q.Refresh = seconds
	return q.Here()
}

// Next is the page that starts after cur.
func (q listQuery) Next(cur driver.Cursor) string {
	v := q.values()
	v.Set("after", formatCursor(cur))
	return pageURL(v)
}

func pageURL(v url.Values) string {
	if len(v) == 0 {
		return "/"
	}
	return "/?" + v.Encode()
}

func formatCursor(c driver.Cursor) string { return fmt.Sprintf("%d.%d", c.Bucket, c.Seq) }

// parseListQuery reads the page's query; an error names the parameter.
func parseListQuery(v url.Values, buckets, refresh int) (listQuery, error) {
	q := listQuery{Status: driver.Parked, Topic: v.Get("topic"), Bucket: -1, Key: v.Get("key"), Refresh: refresh, defRefresh: refresh}
	if s := v.Get("status"); s != "" {
		st, err := parseStatus(s)
		if err != nil {
			return q, fmt.Errorf("status=%q: use pending, parked or dispatched", s)
		}
		q.Status = st
	}
	if b := v.Get("bucket"); b != "" && b != "-1" {
		n, err := strconv.Atoi(b)
		if err != nil || n < 0 || n >= buckets {
			return q, fmt.Errorf("bucket=%q: the store has %d buckets, 0 to %d", b, buckets, buckets-1)
		}
		q.Bucket = n
	}
	if a := v.Get("after"); a != "" {
		bs, ss, ok := strings.Cut(a, ".")
		b, err1 := strconv.Atoi(bs)
		s, err2 := strconv.ParseInt(ss, 10, 64)
		if !ok || err1 != nil || err2 != nil || b < 0 || s < 0 {
			return q, fmt.Errorf("after=%q: a page starts after BUCKET.SEQ", a)
		}
		q.After, q.HasAfter = driver.Cursor{Bucket: b, Seq: s}, true
	}
	if r := v.Get("refresh"); r != "" {
		n, err := strconv.Atoi(r)
		if err != nil || n < 0 || n > 3600 {
			return q, fmt.Errorf("refresh=%q: give seconds, 0 (off) to 3600", r)
		}
		q.Refresh = n
	}
	return q, nil
}

// listPage is one page of the message list.
type listPage struct {
	Messages []*driver.Envelope
	// More says that messages may follow; Next is where the next page starts.
	More bool
	Next driver.Cursor
	// Examined is how many messages were read to fill the page; Cut says the page
	// stopped at the read budget before it was full (a filter matching few messages
	// of a large backlog).
	Examined int
	Cut      bool
}

// listPageSize is how many messages one List call of the page reads.
const listPageSize = 500

// scanPage reads the page of messages with status that match f after the cursor:
// at most limit of them, reading at most budget messages.
func scanPage(ctx context.Context, a driver.Admin, status driver.Status, f filter, after driver.Cursor, limit, budget int) (listPage, error) {
	var p listPage
	cur := after
	if f.bucket >= 0 && cur.Bucket < f.bucket {
		cur = driver.Cursor{Bucket: f.bucket} // Seqs start at 1
	}
	for {
		envs, err := a.List(ctx, status, cur, listPageSize)
		if err != nil {
			return p, err
		}
		for _, e := range envs {
			if f.bucket >= 0 && e.Bucket > f.bucket {
				return p, nil
			}
			if f.match(e) {
				if len(p.Messages) == limit {
					p.More, p.Next = true, driver.After(p.Messages[len(p.Messages)-1])
					return p, nil
				}
				p.Messages = append(p.Messages, e)
			}
			p.Examined++
			cur = driver.After(e)
			if p.Examined >= budget {
				p.More, p.Next, p.Cut = true, cur, len(p.Messages) < limit
				return p, nil
			}
		}
		if len(envs) < listPageSize {
			return p, nil
		}
	}
}
