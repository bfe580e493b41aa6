package sqstransport

import (
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/outboxkit/outbox/driver"
)

// permanentCodes are SQS error codes that retrying cannot fix: the queue is gone, the
// message or its attributes are invalid or too large, access is denied, KMS refuses,
// or the request itself is malformed.
var permanentCodes = map[string]bool{
	"QueueDoesNotExist":                                   true,
	"AWS.SimpleQueueService.NonExistentQueue":             true,
	"InvalidAddress":                                      true,
	"InvalidAttributeName":                                true,
	"InvalidAttributeValue":                               true,
	"InvalidMessageContents":                              true,
	"InvalidParameterValue":                               true,
	"MissingParameter":                                    true,
	"InvalidSecurity":                                     true,
	"AccessDenied":                                        true,
	"AccessDeniedException":                               true,
	"KmsAccessDenied":                                     true,
	"KMS.AccessDeniedException":                           true,
	"KmsDisabled":                                         true,
	"KMS.DisabledException":                               true,
	"KmsInvalidKeyUsage":                                  true,
	"KMS.InvalidKeyUsageException":                        true,
	"KmsInvalidState":                                     true,
	"KMS.KMSInvalidStateException":                        true,
	"KmsNotFound":                                         true,
	"KMS.NotFoundException":                               true,
	"KmsOptInRequired":                                    true,
	"KMS.OptInRequired":                                   true,
	"UnsupportedOperation":                                true,
	"AWS.SimpleQueueService.UnsupportedOperation":         true,
	"BatchRequestTooLong":                                 true,
	"AWS.SimpleQueueService.BatchRequestTooLong":          true,
	"TooManyEntriesInBatchRequest":                        true,
	"AWS.SimpleQueueService.TooManyEntriesInBatchRequest": true,
	"BatchEntryIdsNotDistinct":                            true,
	"AWS.SimpleQueueService.BatchEntryIdsNotDistinct":     true,
	"InvalidBatchEntryId":                                 true,
	"AWS.SimpleQueueService.InvalidBatchEntryId":          true,
	"EmptyBatchRequest":                                   true,
	"AWS.SimpleQueueService.EmptyBatchRequest":            true,
}

// transientCodes are retried even when SQS blames the sender.
var transientCodes = map[string]bool{
	"RequestThrottled":                    true,
	"ThrottlingException":                 true,
	"Throttling":                          true,
	"KmsThrottled":                        true,
	"KMS.ThrottlingException":             true,
	"AWS.SimpleQueueService.KmsThrottled": true,
	"OverLimit":                           true,
	"ServiceUnavailable":                  true,
	"InternalError":                       true,
	"InternalFailure":                     true,
	"ExpiredToken":                        true,
	"RequestExpired":                      true,
}

// classify marks a whole-request failure permanent when its SQS error code says
// retrying cannot help; everything else (network errors, throttling, server errors,
// unknown codes) stays transient.
func classify(err error) error {
	var api smithy.APIError
	if errors.As(err, &api) && permanentCodes[api.ErrorCode()] {
		return driver.Permanent(err)
	}
	return err
}

// EntryError is one SendMessageBatch entry's failure as SQS reported it.
type EntryError struct {
	Code        string
	Message     string
	SenderFault bool
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("sqstransport: %s: %s (sender fault %t)", e.Code, e.Message, e.SenderFault)
}

// entryError classifies a failed entry: known codes decide; otherwise a sender fault
// is permanent and a service fault transient.
func entryError(f types.BatchResultErrorEntry) error {
	e := &EntryError{SenderFault: f.SenderFault}
	if f.Code != nil {
		e.Code = *f.Code
	}
	if f.Message != nil {
		e.Message = *f.Message
	}
	switch {
	case transientCodes[e.Code]:
		return e
	case permanentCodes[e.Code] || e.SenderFault:
		return driver.Permanent(e)
	}
	return e
}
