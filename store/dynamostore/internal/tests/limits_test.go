package tests

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
)

// DynamoDB's size limits, which the in-process server does not enforce: the proxy
// enforces them in front of it, answering a request over a limit the way DynamoDB
// does, with a ValidationException, before the server sees it.
const (
	limitItemSize     = 400 * 1024
	limitPartitionKey = 2048
	limitSortKey      = 1024
)

// limits checks write requests against DynamoDB's item and key size limits. It
// learns each table's key attributes from CreateTable, and reads the stored item
// from the server to size the result of an update.
type limits struct {
	backend string // the server's URL

	mu   sync.Mutex
	keys map[string][2]string // table -> partition and sort key attribute names
	// bounds holds an upper bound of the size of every item written through the
	// proxy, whether each write was applied or refused, so an update of a small item (a
	// lease renewal, a counter) needs no read: a put raises the bound to its item's
	// size, an update by what it may add, and a read of the item resets it when it
	// nears the limit. A key without a bound was never written: its item is absent.
	bounds map[string]int
}

// itemKey names one item of table, by its key attributes.
func (l *limits) itemKey(table string, item attrs) string {
	l.mu.Lock()
	names := l.keys[table]
	l.mu.Unlock()
	return table + "\x00" + attrString(item[names[0]]) + "\x00" + attrString(item[names[1]])
}

// raise raises the bound of an item to n.
func (l *limits) raise(table string, item attrs, n int) {
	k := l.itemKey(table, item)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bounds == nil {
		l.bounds = map[string]int{}
	}
	l.bounds[k] = max(l.bounds[k], n)
}

type attrs = map[string]map[string]any

// check returns a ValidationException message for a request over a limit, or "".
func (l *limits) check(op string, body []byte) string {
	switch op {
	case "CreateTable":
		var in struct {
			TableName string
			KeySchema []struct{ AttributeName, KeyType string }
		}
		if json.Unmarshal(body, &in) == nil {
			var names [2]string
			for _, k := range in.KeySchema {
				if k.KeyType == "HASH" {
					names[0] = k.AttributeName
				} else {
					names[1] = k.AttributeName
				}
			}
			l.mu.Lock()
			if l.keys == nil {
				l.keys = map[string][2]string{}
			}
			l.keys[in.TableName] = names
			l.mu.Unlock()
		}
	case "PutItem":
		var in struct {
			TableName string
			Item      attrs
		}
		if json.Unmarshal(body, &in) == nil {
			return l.put(in.TableName, in.Item)
		}
	case "DeleteItem", "GetItem":
		var in struct {
			TableName string
			Key       attrs
		}
		if json.Unmarshal(body, &in) == nil {
			return l.keySizes(in.TableName, in.Key)
		}
	case "UpdateItem":
		var in update
		if json.Unmarshal(body, &in) == nil {
			return l.update(in)
		}
	case "TransactWriteItems":
		var in struct {
			TransactItems []struct {
				Put *struct {
					TableName string
					Item      attrs
				}
				Update *update
				Delete *struct {
					TableName string
					Key       attrs
				}
				ConditionCheck *struct {
					TableName string
					Key       attrs
				}
			}
		}
		if json.Unmarshal(body, &in) == nil {
			for _, it := range in.TransactItems {
				var msg string
				switch {
				case it.Put != nil:
					msg = l.put(it.Put.TableName, it.Put.Item)
				case it.Update != nil:
					msg = l.update(*it.Update)
				case it.Delete != nil:
					msg = l.keySizes(it.Delete.TableName, it.Delete.Key)
				case it.ConditionCheck != nil:
					msg = l.keySizes(it.ConditionCheck.TableName, it.ConditionCheck.Key)
				}
				if msg != "" {
					return msg
				}
			}
		}
	case "BatchWriteItem":
		var in struct {
			RequestItems map[string][]struct {
				PutRequest    *struct{ Item attrs }
				DeleteRequest *struct{ Key attrs }
			}
		}
		if json.Unmarshal(body, &in) == nil {
			for table, reqs := range in.RequestItems {
				for _, r := range reqs {
					var msg string
					if r.PutRequest != nil {
						msg = l.put(table, r.PutRequest.Item)
					} else if r.DeleteRequest != nil {
						msg = l.keySizes(table, r.DeleteRequest.Key)
					}
					if msg != "" {
						return msg
					}
				}
			}
		}
	}
	return ""
}

func (l *limits) put(table string, item attrs) string {
	if msg := l.keySizes(table, item); msg != "" {
		return msg
	}
	n := dynamoItemSize(item)
	if n > limitItemSize {
		return fmt.Sprintf("Item size has exceeded the maximum allowed size (%d bytes)", n)
	}
	l.raise(table, item, n)
	return ""
}

func (l *limits) keySizes(table string, item attrs) string {
	l.mu.Lock()
	names, ok := l.keys[table]
	l.mu.Unlock()
	if !ok {
		return ""
	}
	if n := len(attrString(item[names[0]])); n > limitPartitionKey {
		return fmt.Sprintf("One or more parameter values were invalid: Size of hashkey has exceeded the maximum size limit of %d bytes (%d)", limitPartitionKey, n)
	}
	if n := len(attrString(item[names[1]])); n > limitSortKey {
		return fmt.Sprintf("One or more parameter values were invalid: Aggregated size of all range keys has exceeded the size limit of %d bytes (%d)", limitSortKey, n)
	}
	return ""
}

// update is an UpdateItem request, alone or in a transaction.
type update struct {
	TableName                 string
	Key                       attrs
	UpdateExpression          string
	ExpressionAttributeNames  map[string]string
	ExpressionAttributeValues attrs
}

var (
	setClause = regexp.MustCompile(`^\s*(#?\w+)\s*=\s*(:\w+)\s*$`)
	addClause = regexp.MustCompile(`^\s*(#?\w+)\s+(:\w+)\s*$`)
	sections  = regexp.MustCompile(`(?i)\b(SET|ADD|REMOVE|DELETE)\b`)
	// notExistsOnly matches a condition that only asks for a missing attribute.
	notExistsOnly = regexp.MustCompile(`^\s*attribute_not_exists\s*\(\s*#?\w+\s*\)\s*$`)
)

// update sizes the item an update would leave: the stored item with the SET and ADD
// clauses applied (only the plain forms "SET name = :value" and "ADD name :value",
// which are what the store sends; an expression of another form is not sized).
func (l *limits) update(in update) string {
	if msg := l.keySizes(in.TableName, in.Key); msg != "" {
		return msg
	}
	added := dynamoItemSize(in.ExpressionAttributeValues)
	for _, n := range in.ExpressionAttributeNames {
		added += len(n)
	}
	k := l.itemKey(in.TableName, in.Key)
	l.mu.Lock()
	bound := l.bounds[k] // 0: never written, absent
	if bound+added+dynamoItemSize(in.Key) <= limitItemSize/2 {
		if l.bounds == nil {
			l.bounds = map[string]int{}
		}
		l.bounds[k] = bound + added + dynamoItemSize(in.Key)
		l.mu.Unlock()
		return ""
	}
	l.mu.Unlock()
	item, err := l.get(in.TableName, in.Key)
	if err != nil || item == nil {
		item = attrs{}
		for k, v := range in.Key {
			item[k] = v
		}
	}
	stored := dynamoItemSize(item)
	name := func(n string) string {
		if strings.HasPrefix(n, "#") {
			return in.ExpressionAttributeNames[n]
		}
		return n
	}
	expr := in.UpdateExpression
	locs := sections.FindAllStringIndex(expr, -1)
	for i, loc := range locs {
		end := len(expr)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		verb := strings.ToUpper(expr[loc[0]:loc[1]])
		for _, clause := range strings.Split(expr[loc[1]:end], ",") {
			switch verb {
			case "SET":
				m := setClause.FindStringSubmatch(clause)
				if m == nil {
					return ""
				}
				item[name(m[1])] = in.ExpressionAttributeValues[m[2]]
			case "ADD":
				m := addClause.FindStringSubmatch(clause)
				if m == nil {
					return ""
				}
				v := in.ExpressionAttributeValues[m[2]]
				if old, ok := item[name(m[1])]; ok && dynamoValueSize(old) > dynamoValueSize(v) {
					v = old
				}
				item[name(m[1])] = v
			case "REMOVE":
				delete(item, name(strings.TrimSpace(clause)))
			default:
				return ""
			}
		}
	}
	n := dynamoItemSize(item)
	if n > limitItemSize {
		return fmt.Sprintf("Item size to update has exceeded the maximum allowed size (%d bytes)", n)
	}
	l.mu.Lock()
	if l.bounds == nil {
		l.bounds = map[string]int{}
	}
	l.bounds[k] = max(n, stored) // the update may be refused: the item stays as it was
	l.mu.Unlock()
	return ""
}

// get reads an item from the server, as stored (tick values rebased back).
func (l *limits) get(table string, key attrs) (attrs, error) {
	body, err := json.Marshal(map[string]any{"TableName": table, "Key": key, "ConsistentRead": true})
	if err != nil {
		return nil, err
	}
	body = rebaseTicks(bytes.ReplaceAll(body, emptyBinary, binaryMarker), true)
	req, err := http.NewRequest(http.MethodPost, l.backend, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.GetItem")
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	raw = bytes.ReplaceAll(rebaseTicks(raw, false), binaryMarker, emptyBinary)
	var out struct{ Item attrs }
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out.Item, nil
}

// dynamoItemSize is an item's size as DynamoDB counts it against its limit: the
// UTF-8 length of every attribute name plus the size of its value.
func dynamoItemSize(item attrs) int {
	n := 0
	for name, v := range item {
		n += len(name) + dynamoValueSize(v)
	}
	return n
}

func dynamoValueSize(v map[string]any) int {
	for typ, x := range v {
		switch typ {
		case "S":
			s, _ := x.(string)
			return len(s)
		case "B":
			s, _ := x.(string)
			b, _ := base64.StdEncoding.DecodeString(s)
			return len(b)
		case "N":
			s, _ := x.(string)
			return numberBytes(s)
		case "BOOL", "NULL":
			return 1
		case "SS", "NS", "BS":
			n := 0
			for _, e := range x.([]any) {
				s, _ := e.(string)
				switch typ {
				case "SS":
					n += len(s)
				case "NS":
					n += numberBytes(s)
				default:
					b, _ := base64.StdEncoding.DecodeString(s)
					n += len(b)
				}
			}
			return n
		case "L":
			n := 3
			for _, e := range x.([]any) {
				m, _ := e.(map[string]any)
				n += 1 + dynamoValueSize(m)
			}
			return n
		case "M":
			n := 3
			for k, e := range x.(map[string]any) {
				m, _ := e.(map[string]any)
				n += 1 + len(k) + dynamoValueSize(m)
			}
			return n
		}
	}
	return 0
}

// numberBytes is DynamoDB's size of a number: one byte per two significant digits,
// plus one; leading and trailing zeros do not count.
func numberBytes(s string) int {
	digits := strings.Trim(strings.NewReplacer("-", "", ".", "").Replace(s), "0")
	return (len(digits)+1)/2 + 1
}

func attrString(v map[string]any) string {
	if s, ok := v["S"].(string); ok {
		return s
	}
	if s, ok := v["B"].(string); ok {
		b, _ := base64.StdEncoding.DecodeString(s)
		return string(b)
	}
	if s, ok := v["N"].(string); ok {
		return s
	}
	return ""
}
