package xds

// Turning one DeltaDiscoveryResponse into Handler calls and the ACK or NACK
// that answers it. Nothing here does I/O, so it is tested (and fuzzed)
// without sockets.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// Type URLs of the two resource types ztunnel subscribes to, as istiod
// serves them.
const (
	TypeURLAddress       = "type.googleapis.com/istio.workload.Address"
	TypeURLAuthorization = "type.googleapis.com/istio.security.Authorization"
)

// subscribedTypes is the order of the initial requests (upstream's order).
var subscribedTypes = []string{TypeURLAddress, TypeURLAuthorization}

// maxNackEntries bounds how many rejected resources a NACK message names:
// error_detail is logged by istiod as one line, and a push of thousands of
// bad resources should not produce a megabyte of it.
const maxNackEntries = 50

// Per-resource decode failures, each a named reason.
var (
	errNoBody       = errors.New("resource has no body")
	errTypeMismatch = errors.New("resource type does not match the response type")
	errDecode       = errors.New("cannot decode resource")
	errUnsupported  = errors.New("type URL is not subscribed by this client")
)

// versionTracker remembers, per type URL, the version of every resource this
// client has accepted. It is what the client claims in
// initial_resource_versions on reconnect. It is owned by the Run goroutine.
type versionTracker struct {
	byType map[string]map[string]string // type URL → resource name → version
}

func newVersionTracker() *versionTracker {
	t := &versionTracker{byType: make(map[string]map[string]string)}
	for _, u := range subscribedTypes {
		t.byType[u] = make(map[string]string)
	}
	return t
}

// initial returns a copy of the versions held for typeURL.
func (t *versionTracker) initial(typeURL string) map[string]string {
	return maps.Clone(t.byType[typeURL])
}

// count is how many resources of typeURL are held.
func (t *versionTracker) count(typeURL string) int { return len(t.byType[typeURL]) }

// outcome is what handling one response produced.
type outcome struct {
	typeURL  string
	nonce    string
	upserts  int
	removes  int
	rejected map[string]error // resource name → reason; nil when all accepted
	typeErr  error            // the whole response was refused (unknown type)
}

// nack reports whether the response must be rejected.
func (o *outcome) nack() bool { return o.typeErr != nil || len(o.rejected) > 0 }

// request is the ACK or NACK answering the response.
func (o *outcome) request() *discovery.DeltaDiscoveryRequest {
	req := &discovery.DeltaDiscoveryRequest{TypeUrl: o.typeURL, ResponseNonce: o.nonce}
	if o.nack() {
		req.ErrorDetail = &rpcstatus.Status{
			Code:    int32(codes.InvalidArgument),
			Message: o.message(),
		}
	}
	return req
}

// message is the NACK text: "name: reason" for each rejected resource,
// sorted by name and joined with "; " (upstream's shape).
func (o *outcome) message() string {
	if o.typeErr != nil {
		return fmt.Sprintf("%s: %v", o.typeURL, o.typeErr)
	}
	names := slices.Sorted(maps.Keys(o.rejected))
	var b strings.Builder
	for i, name := range names {
		if i == maxNackEntries {
			fmt.Fprintf(&b, "; and %d more", len(names)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %v", displayName(name), o.rejected[name])
	}
	return b.String()
}

// displayName quotes a resource name only when it would otherwise be
// unreadable or ambiguous in a NACK message.
func displayName(name string) string {
	if name == "" || strings.Contains(name, "; ") || strings.ContainsFunc(name, func(r rune) bool {
		return !unicode.IsPrint(r) || unicode.IsSpace(r)
	}) {
		return strconv.Quote(name)
	}
	return name
}

// apply decodes resp, hands it to h and updates the tracked versions. Valid
// resources are applied even when others in the same response are
// rejected; a rejected resource keeps its previous version (if it had one)
// so that the server sees it as out of date after a reconnect and sends it
// again.
func (t *versionTracker) apply(h Handler, resp *discovery.DeltaDiscoveryResponse) *outcome {
	o := &outcome{typeURL: resp.GetTypeUrl(), nonce: resp.GetNonce()}
	removes := resp.GetRemovedResources()
	var rejected map[string]error
	switch o.typeURL {
	case TypeURLAddress:
		ups, bad := decodeAll(resp, func() *workloadpb.Address { return new(workloadpb.Address) })
		rejected = merge(bad, h.UpdateAddresses(ups, removes))
		o.upserts = len(ups)
	case TypeURLAuthorization:
		ups, bad := decodeAll(resp, func() *securitypb.Authorization { return new(securitypb.Authorization) })
		rejected = merge(bad, h.UpdateAuthorizations(ups, removes))
		o.upserts = len(ups)
	default:
		o.typeErr = errUnsupported
		return o
	}
	o.removes = len(removes)
	if len(rejected) > 0 {
		o.rejected = rejected
	}

	held := t.byType[o.typeURL]
	for _, r := range resp.GetResources() {
		if _, bad := rejected[r.GetName()]; !bad {
			held[r.GetName()] = r.GetVersion()
		}
	}
	for _, name := range removes {
		// A removal the handler refused leaves the resource in place; keep
		// claiming it so that a reconnect brings the removal again.
		if _, bad := rejected[name]; !bad {
			delete(held, name)
		}
	}
	return o
}

// decodeAll decodes every resource of resp into a fresh T. Resources that do
// not decode are returned in bad, keyed by name. When a name repeats, the
// last occurrence wins.
func decodeAll[T proto.Message](resp *discovery.DeltaDiscoveryResponse, newT func() T) (ups map[string]T, bad map[string]error) {
	ups = make(map[string]T, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		msg := newT()
		if err := decodeResource(r, resp.GetTypeUrl(), msg); err != nil {
			if bad == nil {
				bad = make(map[string]error)
			}
			bad[r.GetName()] = err
			delete(ups, r.GetName())
			continue
		}
		delete(bad, r.GetName())
		ups[r.GetName()] = msg
	}
	return ups, bad
}

// decodeResource unmarshals the body of r into msg. The Any's type URL, when
// set, must be the response's: a server that mixes types in one response is
// broken, and decoding bytes of one type as another "succeeds" silently.
func decodeResource(r *discovery.Resource, typeURL string, msg proto.Message) error {
	body := r.GetResource()
	if body == nil {
		return errNoBody
	}
	if u := body.GetTypeUrl(); u != "" && u != typeURL {
		return fmt.Errorf("%w: got %q", errTypeMismatch, u)
	}
	if err := proto.Unmarshal(body.GetValue(), msg); err != nil {
		return fmt.Errorf("%w: %w", errDecode, err)
	}
	return nil
}

// merge adds the handler's rejections to the decode failures. Either may be
// nil.
func merge(bad, rejected map[string]error) map[string]error {
	if len(rejected) == 0 {
		return bad
	}
	if bad == nil {
		bad = make(map[string]error, len(rejected))
	}
	for name, err := range rejected {
		if err == nil {
			err = errors.New("rejected")
		}
		bad[name] = err
	}
	return bad
}
