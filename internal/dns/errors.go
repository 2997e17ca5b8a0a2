package dns

import "fmt"

// Reason names why a request or a forward went wrong. Each is used both in
// the error or log line and as the reason label of ztunnel_dns_errors_total.
type Reason string

const (
	// ReasonShort: a packet too short to hold a DNS header. Not answered
	// (there is no id to answer to, and answers to junk amplify attacks).
	ReasonShort Reason = "short_packet"
	// ReasonMalformed: a header followed by bytes that do not parse.
	// Answered FORMERR.
	ReasonMalformed Reason = "malformed"
	// ReasonNotRequest: a response sent to the server. Not answered.
	ReasonNotRequest Reason = "not_request"
	// ReasonOpcode: an opcode other than QUERY (NOTIFY, UPDATE, …).
	// Answered NOTIMP.
	ReasonOpcode Reason = "opcode"
	// ReasonQuestions: a question count other than one (RFC 9619). Answered
	// FORMERR.
	ReasonQuestions Reason = "question_count"
	// ReasonSections: records in the answer or authority section, or more
	// than two additional records (EDNS OPT and TSIG). Answered FORMERR.
	ReasonSections Reason = "sections"
	// ReasonForwardTimeout: no upstream resolver answered within the
	// forward timeout. Answered SERVFAIL.
	ReasonForwardTimeout Reason = "forward_timeout"
	// ReasonForwardError: every upstream resolver failed (refused, bad
	// reply) or none is configured. Answered SERVFAIL.
	ReasonForwardError Reason = "forward_error"
	// ReasonOverloaded: too many forwards in flight. Answered SERVFAIL
	// without forwarding.
	ReasonOverloaded Reason = "overloaded"
	// ReasonWrite: the answer could not be sent back to the client.
	ReasonWrite Reason = "write"
)

var allReasons = []Reason{
	ReasonShort, ReasonMalformed, ReasonNotRequest, ReasonOpcode, ReasonQuestions,
	ReasonSections, ReasonForwardTimeout, ReasonForwardError, ReasonOverloaded, ReasonWrite,
}

// Error is a failed request or forward with its reason.
type Error struct {
	Reason Reason
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("dns: %s: %v", e.Reason, e.Err) }

func (e *Error) Unwrap() error { return e.Err }
