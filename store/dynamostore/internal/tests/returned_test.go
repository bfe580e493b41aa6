package tests

import (
	"bytes"
	"encoding/json"
)

// returnOldItems evens out one more difference between the API server and DynamoDB,
// on the response to a refused write that asked for the old item
// (ReturnValuesOnConditionCheckFailure ALL_OLD):
//
//   - The server returns no item for a refused Put, only for a refused Update;
//     DynamoDB returns the item that stands under the key. The proxy reads it from
//     the server and adds it to the ConditionalCheckFailedException, or to the
//     transaction's cancellation reason.
//   - In a cancelled transaction the server reports only the first failed
//     condition; DynamoDB reports every one. The proxy reports, too, every Put
//     conditioned on attribute_not_exists alone whose item exists: its condition
//     failed.
//
// sent and body are the request and response as the client sees them.
func (l *limits) returnOldItems(op string, sent, body []byte) []byte {
	switch op {
	case "PutItem":
		if !bytes.Contains(body, []byte("ConditionalCheckFailedException")) {
			return body
		}
		var in struct {
			TableName                           string
			Item                                attrs
			ReturnValuesOnConditionCheckFailure string
		}
		var out map[string]any
		if json.Unmarshal(sent, &in) != nil || in.ReturnValuesOnConditionCheckFailure != "ALL_OLD" || json.Unmarshal(body, &out) != nil {
			return body
		}
		if _, ok := out["Item"]; ok {
			return body
		}
		if item, err := l.get(in.TableName, l.keyOf(in.TableName, in.Item)); err == nil && item != nil {
			out["Item"] = item
		}
		if b, err := json.Marshal(out); err == nil {
			return b
		}
	case "TransactWriteItems":
		if !bytes.Contains(body, []byte("TransactionCanceledException")) {
			return body
		}
		var in struct {
			TransactItems []struct {
				Put *struct {
					TableName                           string
					Item                                attrs
					ConditionExpression                 string
					ReturnValuesOnConditionCheckFailure string
				}
			}
		}
		var out struct {
			Type                string `json:"__type"`
			Message             string `json:"message"`
			CancellationReasons []map[string]any
		}
		if json.Unmarshal(sent, &in) != nil || json.Unmarshal(body, &out) != nil || len(out.CancellationReasons) != len(in.TransactItems) {
			return body
		}
		for i, it := range in.TransactItems {
			put, reason := it.Put, out.CancellationReasons[i]
			if put == nil || put.ReturnValuesOnConditionCheckFailure != "ALL_OLD" || reason["Item"] != nil {
				continue
			}
			code, _ := reason["Code"].(string)
			notExists := notExistsOnly.MatchString(put.ConditionExpression)
			if code != "ConditionalCheckFailed" && !(code == "None" && notExists) {
				continue
			}
			item, err := l.get(put.TableName, l.keyOf(put.TableName, put.Item))
			if err != nil || item == nil {
				continue
			}
			reason["Code"] = "ConditionalCheckFailed"
			reason["Message"] = "The conditional request failed"
			reason["Item"] = item
		}
		if b, err := json.Marshal(out); err == nil {
			return b
		}
	}
	return body
}

// keyOf returns the key attributes of item in table.
func (l *limits) keyOf(table string, item attrs) attrs {
	l.mu.Lock()
	names, ok := l.keys[table]
	l.mu.Unlock()
	key := attrs{}
	if !ok {
		return key
	}
	for _, n := range names {
		if v, ok := item[n]; ok && n != "" {
			key[n] = v
		}
	}
	return key
}
