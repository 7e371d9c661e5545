package protocol

import (
	"errors"
	"testing"
)

func TestStatus(t *testing.T) {
	for s, want := range map[Status]string{
		StatusSuccess:               "STATUS_SUCCESS",
		StatusPending:               "STATUS_PENDING",
		StatusBufferOverflow:        "STATUS_BUFFER_OVERFLOW",
		StatusInvalidHandle:         "STATUS_INVALID_HANDLE",
		StatusInvalidParameter:      "STATUS_INVALID_PARAMETER",
		StatusEndOfFile:             "STATUS_END_OF_FILE",
		StatusAccessDenied:          "STATUS_ACCESS_DENIED",
		StatusObjectNameNotFound:    "STATUS_OBJECT_NAME_NOT_FOUND",
		StatusNotSupported:          "STATUS_NOT_SUPPORTED",
		StatusCancelled:             "STATUS_CANCELLED",
		StatusInsufficientResources: "STATUS_INSUFFICIENT_RESOURCES",
		NotifyCredit:                "LWIO_NOTIFY_CREDIT",
		Status(0xC0DEC0DE):          "NTSTATUS(0xC0DEC0DE)",
	} {
		if s.String() != want || s.Error() != want {
			t.Errorf("%#x: %q, want %q", uint32(s), s.String(), want)
		}
	}
	// [MS-ERREF] values the wire carries.
	if StatusAccessDenied != 0xC0000022 || StatusSuccess != 0 || StatusEndOfFile != 0xC0000011 {
		t.Error("NTSTATUS values changed")
	}
	if StatusSuccess.Err() != nil {
		t.Error("success is an error")
	}
	var err error = StatusAccessDenied.Err()
	var s Status
	if !errors.As(err, &s) || s != StatusAccessDenied {
		t.Errorf("Err() = %v", err)
	}
	if !StatusAccessDenied.IsError() || StatusPending.IsError() || StatusBufferOverflow.IsError() {
		t.Error("IsError severity")
	}
	if IsProtocolError(StatusAccessDenied) {
		t.Error("a per-request status taken for a protocol error")
	}
}
