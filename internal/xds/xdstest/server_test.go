package xdstest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// rawStream opens a DeltaAggregatedResources stream with a plain gRPC
// client, so the server is tested without internal/xds.
func rawStream(t *testing.T, addr string, md metadata.MD) discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 10*time.Second)
	t.Cleanup(func() {
		cancel()
		conn.Close()
	})
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestServeRawAndRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := NewServer(t, Options{})
	raw := []byte{0xff, 0x00, 0x01}
	srv.SetRaw(TypeURLAddress, "junk", raw)
	addr := srv.Addr()

	st := rawStream(t, addr, nil)
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeURLAddress, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 1 || resp.GetResources()[0].GetName() != "junk" {
		t.Fatalf("resources %v", resp.GetResources())
	}
	body := resp.GetResources()[0].GetResource()
	if body.GetTypeUrl() != TypeURLAddress || !bytes.Equal(body.GetValue(), raw) {
		t.Fatalf("body %q %x, want exact raw bytes", body.GetTypeUrl(), body.GetValue())
	}
	version := resp.GetResources()[0].GetVersion()

	// A NACK is logged with its detail.
	from := srv.RequestCount()
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeURLAddress, ResponseNonce: resp.GetNonce(),
		ErrorDetail: status.New(codes.InvalidArgument, "junk: bad").Proto()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nack, err := srv.WaitRequest(ctx, from, func(r Request) bool { return !r.Initial() })
	if err != nil {
		t.Fatal(err)
	}
	if !nack.NACK() || nack.Msg.GetErrorDetail().GetMessage() != "junk: bad" {
		t.Fatalf("logged %v", nack.Msg)
	}

	srv.Stop()
	if _, err := st.Recv(); err == nil {
		t.Fatal("stream survived Stop")
	}
	srv.Stop() // twice is fine
	srv.Remove(TypeURLAddress, "junk")
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if srv.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", srv.Addr(), addr)
	}

	// Reconnecting with the old version learns of the removal.
	st = rawStream(t, addr, nil)
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeURLAddress, ResourceNamesSubscribe: []string{"*"},
		InitialResourceVersions: map[string]string{"junk": version}}); err != nil {
		t.Fatal(err)
	}
	resp, err = st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResources()) != 0 || len(resp.GetRemovedResources()) != 1 || resp.GetRemovedResources()[0] != "junk" {
		t.Fatalf("after restart: resources %v removed %v, want removal of junk", resp.GetResources(), resp.GetRemovedResources())
	}
	reqs := srv.Requests()
	if last := reqs[len(reqs)-1]; last.Stream <= nack.Stream {
		t.Fatalf("stream id %d not above %d after restart", last.Stream, nack.Stream)
	}
}

func TestTokenRequired(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	tests := []struct {
		name string
		md   metadata.MD
		want codes.Code
	}{
		{name: "no token", want: codes.Unauthenticated},
		{name: "wrong token", md: metadata.Pairs("authorization", "Bearer nope"), want: codes.Unauthenticated},
		{name: "right token", md: metadata.Pairs("authorization", "Bearer tok"), want: codes.OK},
	}
	srv := NewServer(t, Options{Token: "tok"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := rawStream(t, srv.Addr(), tt.md)
			// A server that refuses the stream may have closed it before
			// Send: gRPC then reports io.EOF and the status comes from Recv.
			if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeURLAuthorization}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			_, err := st.Recv()
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}
