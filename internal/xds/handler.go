package xds

import (
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// Handler receives configuration from a source (the delta ADS client or the
// LOCAL_XDS_PATH file). internal/state satisfies it; it is declared here so
// that state never imports xds.
//
// Every method applies what it can: each resource that fails validation is
// left out and reported in the returned map (resource name → reason), while
// every valid resource is applied. A source turns a non-empty map into a NACK
// (xDS) or a start-up error (local file); the previous value of a rejected
// resource keeps serving.
type Handler interface {
	// UpdateAddresses inserts or replaces the given Address resources (keyed by
	// xDS resource name) and then removes the named ones.
	UpdateAddresses(upserts map[string]*workloadpb.Address, removes []string) map[string]error
	// UpdateAuthorizations does the same for Authorization resources.
	UpdateAuthorizations(upserts map[string]*securitypb.Authorization, removes []string) map[string]error
	// ReplaceAddresses makes the given set the whole Address state: anything
	// not named is removed.
	ReplaceAddresses(all map[string]*workloadpb.Address) map[string]error
	// ReplaceAuthorizations makes the given set the whole Authorization state.
	ReplaceAuthorizations(all map[string]*securitypb.Authorization) map[string]error
}
