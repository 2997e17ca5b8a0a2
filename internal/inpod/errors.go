package inpod

import "fmt"

// Reason names why a ZDS request was rejected. The same string is the
// "reason" label of istio_workload_manager_zds_errors_total and appears in
// the Ack error text the node agent logs.
type Reason string

// Rejection reasons. The framing ones (truncated … unexpected_fd) come from
// the packet itself; the rest from the state machine.
const (
	// ReasonTruncated: the packet or its control data did not fit the
	// receive buffers (MSG_TRUNC / MSG_CTRUNC).
	ReasonTruncated Reason = "truncated"
	// ReasonBadControl: ancillary data that is not well-formed SCM_RIGHTS.
	ReasonBadControl Reason = "bad_control_message"
	// ReasonDecode: the bytes are not a WorkloadRequest protobuf.
	ReasonDecode Reason = "decode"
	// ReasonUnknownPayload: a WorkloadRequest with no payload this version
	// knows (empty, or a oneof field added by a newer agent).
	ReasonUnknownPayload Reason = "unknown_payload"
	// ReasonMissingFD: AddWorkload without the netns FD in SCM_RIGHTS.
	ReasonMissingFD Reason = "missing_fd"
	// ReasonTooManyFDs: more than one FD arrived with AddWorkload.
	ReasonTooManyFDs Reason = "too_many_fds"
	// ReasonUnexpectedFD: an FD arrived with a message other than AddWorkload.
	ReasonUnexpectedFD Reason = "unexpected_fd"
	// ReasonNotNetns: the FD is not a network namespace.
	ReasonNotNetns Reason = "not_netns"
	// ReasonMissingUID: AddWorkload with an empty uid.
	ReasonMissingUID Reason = "missing_uid"
	// ReasonMissingInfo: AddWorkload without workload_info (upstream
	// requires it too).
	ReasonMissingInfo Reason = "missing_workload_info"
	// ReasonKeepAfterSnapshot: KeepWorkload is only valid before
	// SnapshotSent on a connection.
	ReasonKeepAfterSnapshot Reason = "keep_after_snapshot"
	// ReasonKeepUnknown: KeepWorkload for a pod this ztunnel does not run
	// (for example after ztunnel itself restarted). Nothing changes; the
	// agent only logs the error.
	ReasonKeepUnknown Reason = "keep_unknown"
	// ReasonDuplicateSnapshot: a second SnapshotSent on one connection.
	ReasonDuplicateSnapshot Reason = "duplicate_snapshot"
	// ReasonStartFailed: the PodServer could not start the pod's proxy; the
	// pod is kept pending and retried.
	ReasonStartFailed Reason = "start_failed"
)

// Error is a rejected ZDS request. It is sent back to the agent as the Ack
// error text; the connection stays up.
type Error struct {
	Reason Reason
	UID    string // empty when unknown
	Err    error  // detail; may be nil
}

func (e *Error) Error() string {
	s := "inpod: " + string(e.Reason)
	if e.UID != "" {
		s += fmt.Sprintf(": uid %q", e.UID)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

func reject(r Reason, uid string, format string, args ...any) *Error {
	return &Error{Reason: r, UID: uid, Err: fmt.Errorf(format, args...)}
}
