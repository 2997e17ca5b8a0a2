package state_test

import (
	"errors"
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

// TestFaultMalformedPolicyEnforced: an Authorization with a malformed CIDR
// is reported rejected with ReasonFailClosed (so xds NACKs it and the
// counter moves) and its fail-closed form is in the snapshot; a policy
// with a malformed action is rejected and absent.
func TestFaultMalformedPolicyEnforced(t *testing.T) {
	cases := []struct {
		name    string
		pol     *securitypb.Authorization
		reason  state.Reason
		applied bool
	}{
		{"DENY with a 3-byte CIDR", func() *securitypb.Authorization {
			p := policy("ns", "p", 0, securitypb.Action_DENY)
			p.Rules = []*securitypb.Rule{{Clauses: []*securitypb.Clause{{Matches: []*securitypb.Match{
				{SourceIps: []*securitypb.Address{{Address: []byte{10, 0, 0}, Length: 8}}}}}}}}
			return p
		}(), state.ReasonFailClosed, true},
		{"unknown action", policy("ns", "p", 0, 2), state.ReasonUnknownEnum, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			err := oneError(t, s.UpdateAuthorizations(map[string]*securitypb.Authorization{"ns/p": tc.pol}, nil))
			var re *state.RejectError
			if !errors.As(err, &re) || re.Reason != tc.reason {
				t.Fatalf("error = %v, want reason %q", err, tc.reason)
			}
			if got := s.Snapshot().Policy("ns/p") != nil; got != tc.applied {
				t.Errorf("policy in snapshot = %v, want %v", got, tc.applied)
			}
		})
	}
}
