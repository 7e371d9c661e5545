package protocol

import "fmt"

// Status is an NTSTATUS code, the result of one request (the Status of an
// IO_STATUS_BLOCK). It implements error; StatusSuccess is not an error and
// should be turned into nil by callers (see Status.Err).
type Status uint32

// NTSTATUS values used by LWIO and the session channel ([MS-ERREF] 2.3.1).
const (
	StatusSuccess               Status = 0x00000000
	StatusPending               Status = 0x00000103
	StatusBufferOverflow        Status = 0x80000005
	StatusNoMoreFiles           Status = 0x80000006
	StatusUnsuccessful          Status = 0xC0000001
	StatusNotImplemented        Status = 0xC0000002
	StatusInvalidHandle         Status = 0xC0000008
	StatusInvalidParameter      Status = 0xC000000D
	StatusNoSuchFile            Status = 0xC000000F
	StatusEndOfFile             Status = 0xC0000011
	StatusMoreProcessingReq     Status = 0xC0000016
	StatusNoMemory              Status = 0xC0000017
	StatusAccessDenied          Status = 0xC0000022
	StatusBufferTooSmall        Status = 0xC0000023
	StatusObjectNameInvalid     Status = 0xC0000033
	StatusObjectNameNotFound    Status = 0xC0000034
	StatusObjectNameCollision   Status = 0xC0000035
	StatusObjectPathNotFound    Status = 0xC000003A
	StatusSharingViolation      Status = 0xC0000043
	StatusEASNotSupported       Status = 0xC000004F
	StatusNoEAsOnFile           Status = 0xC0000052
	StatusDiskFull              Status = 0xC000007F
	StatusInsufficientResources Status = 0xC000009A
	StatusFileIsADirectory      Status = 0xC00000BA
	StatusNotSupported          Status = 0xC00000BB
	StatusBadNetworkName        Status = 0xC00000CC
	StatusRequestNotAccepted    Status = 0xC00000D0
	StatusIOTimeout             Status = 0xC00000B5
	StatusInvalidDeviceRequest  Status = 0xC0000010
	StatusDirectoryNotEmpty     Status = 0xC0000101
	StatusNotADirectory         Status = 0xC0000103
	StatusCancelled             Status = 0xC0000120
	StatusFileClosed            Status = 0xC0000128
	StatusConnectionReset       Status = 0xC000020D
	StatusLogonFailure          Status = 0xC000006D
	StatusMediaWriteProtected   Status = 0xC00000A2
	StatusTooManyLinks          Status = 0xC0000265
	StatusStoppedOnSymlink      Status = 0x8000002D
	StatusNameTooLong           Status = 0xC0000106
	StatusNotSameDevice         Status = 0xC00000D4
	StatusFileTooLarge          Status = 0xC0000904
	StatusCannotDelete          Status = 0xC0000121
	StatusIOError               Status = 0xC0000185
	StatusInvalidNetworkResp    Status = 0xC00000C3
)

// NotifyCredit is the Status of a server delta-credit message (FIG. 11A) and
// of the completion that lets a client retire a credit (FIG. 11C). The seed
// calls it both LWIO_NOTIFY_CREDIT and LWIO_CREDIT_NOTIFY; it is one value.
const NotifyCredit Status = 0x1

var statusNames = map[Status]string{
	StatusSuccess:               "STATUS_SUCCESS",
	NotifyCredit:                "LWIO_NOTIFY_CREDIT",
	StatusPending:               "STATUS_PENDING",
	StatusBufferOverflow:        "STATUS_BUFFER_OVERFLOW",
	StatusNoMoreFiles:           "STATUS_NO_MORE_FILES",
	StatusUnsuccessful:          "STATUS_UNSUCCESSFUL",
	StatusNotImplemented:        "STATUS_NOT_IMPLEMENTED",
	StatusInvalidHandle:         "STATUS_INVALID_HANDLE",
	StatusInvalidParameter:      "STATUS_INVALID_PARAMETER",
	StatusNoSuchFile:            "STATUS_NO_SUCH_FILE",
	StatusEndOfFile:             "STATUS_END_OF_FILE",
	StatusMoreProcessingReq:     "STATUS_MORE_PROCESSING_REQUIRED",
	StatusNoMemory:              "STATUS_NO_MEMORY",
	StatusAccessDenied:          "STATUS_ACCESS_DENIED",
	StatusBufferTooSmall:        "STATUS_BUFFER_TOO_SMALL",
	StatusObjectNameInvalid:     "STATUS_OBJECT_NAME_INVALID",
	StatusObjectNameNotFound:    "STATUS_OBJECT_NAME_NOT_FOUND",
	StatusObjectNameCollision:   "STATUS_OBJECT_NAME_COLLISION",
	StatusObjectPathNotFound:    "STATUS_OBJECT_PATH_NOT_FOUND",
	StatusSharingViolation:      "STATUS_SHARING_VIOLATION",
	StatusEASNotSupported:       "STATUS_EAS_NOT_SUPPORTED",
	StatusNoEAsOnFile:           "STATUS_NO_EAS_ON_FILE",
	StatusDiskFull:              "STATUS_DISK_FULL",
	StatusInsufficientResources: "STATUS_INSUFFICIENT_RESOURCES",
	StatusFileIsADirectory:      "STATUS_FILE_IS_A_DIRECTORY",
	StatusNotSupported:          "STATUS_NOT_SUPPORTED",
	StatusBadNetworkName:        "STATUS_BAD_NETWORK_NAME",
	StatusRequestNotAccepted:    "STATUS_REQUEST_NOT_ACCEPTED",
	StatusIOTimeout:             "STATUS_IO_TIMEOUT",
	StatusInvalidDeviceRequest:  "STATUS_INVALID_DEVICE_REQUEST",
	StatusDirectoryNotEmpty:     "STATUS_DIRECTORY_NOT_EMPTY",
	StatusNotADirectory:         "STATUS_NOT_A_DIRECTORY",
	StatusCancelled:             "STATUS_CANCELLED",
	StatusFileClosed:            "STATUS_FILE_CLOSED",
	StatusConnectionReset:       "STATUS_CONNECTION_RESET",
	StatusLogonFailure:          "STATUS_LOGON_FAILURE",
	StatusMediaWriteProtected:   "STATUS_MEDIA_WRITE_PROTECTED",
	StatusTooManyLinks:          "STATUS_TOO_MANY_LINKS",
	StatusStoppedOnSymlink:      "STATUS_STOPPED_ON_SYMLINK",
	StatusNameTooLong:           "STATUS_NAME_TOO_LONG",
	StatusNotSameDevice:         "STATUS_NOT_SAME_DEVICE",
	StatusFileTooLarge:          "STATUS_FILE_TOO_LARGE",
	StatusCannotDelete:          "STATUS_CANNOT_DELETE",
	StatusIOError:               "STATUS_IO_DEVICE_ERROR",
	StatusInvalidNetworkResp:    "STATUS_INVALID_NETWORK_RESPONSE",

	// Codes the session channel's errno table uses (protocol/session/errno.go).
	0xC0000061: "STATUS_PRIVILEGE_NOT_HELD",
	0xC0000050: "STATUS_EA_TOO_LARGE",
	0xC0000044: "STATUS_QUOTA_EXCEEDED",
	0xC0000280: "STATUS_REPARSE_POINT_NOT_RESOLVED",
	0xC0000098: "STATUS_FILE_INVALID",
	0xC0000184: "STATUS_INVALID_DEVICE_STATE",
	0xC0000054: "STATUS_FILE_LOCK_CONFLICT",
	0xC00000C9: "STATUS_NETWORK_NAME_DELETED",
	0xC000011F: "STATUS_TOO_MANY_OPENED_FILES",
	0xC0000064: "STATUS_NO_SUCH_USER",
}

// String returns the status's name, e.g. "STATUS_ACCESS_DENIED".
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("NTSTATUS(0x%08X)", uint32(s))
}

// Error implements error.
func (s Status) Error() string { return s.String() }

// Err returns nil for StatusSuccess and s otherwise.
func (s Status) Err() error {
	if s == StatusSuccess {
		return nil
	}
	return s
}

// IsError reports whether s has the error severity (top two bits 11).
func (s Status) IsError() bool { return s>>30 == 3 }
