package inpod

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// seqpacketPair returns two connected SOCK_SEQPACKET ends.
func seqpacketPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conv := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	a, b = conv(fds[0]), conv(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func openFDCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func addReq(uid string) *zdspb.WorkloadRequest {
	return &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{
		Uid: uid, WorkloadInfo: &zdspb.WorkloadInfo{Name: "n", Namespace: "ns", ServiceAccount: "sa"}}}}
}

func TestReadRequest(t *testing.T) {
	devnull := func(t *testing.T) int {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	// An unknown oneof member (field 9, varint 1), as a newer agent might send.
	unknownPayload := []byte{0x48, 0x01}
	cases := []struct {
		name     string
		data     []byte
		nfds     int
		want     Kind
		wantUID  string
		wantInfo bool
		reason   Reason
	}{
		{name: "add with fd", data: marshal(t, addReq("u1")), nfds: 1, want: KindAdd, wantUID: "u1", wantInfo: true},
		{name: "add without info", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: "u2"}}}), nfds: 1, want: KindAdd, wantUID: "u2"},
		{name: "keep", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: "k"}}}), want: KindKeep, wantUID: "k"},
		{name: "del", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: "d"}}}), want: KindDel, wantUID: "d"},
		{name: "snapshot sent", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}), want: KindSnapshotSent},
		{name: "add without fd", data: marshal(t, addReq("u3")), reason: ReasonMissingFD},
		{name: "add with two fds", data: marshal(t, addReq("u4")), nfds: 2, reason: ReasonTooManyFDs},
		{name: "del with fd", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: "d"}}}), nfds: 1, reason: ReasonUnexpectedFD},
		{name: "snapshot with fd", data: marshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}), nfds: 1, reason: ReasonUnexpectedFD},
		{name: "oversized packet", data: make([]byte, MaxMessageSize+1), reason: ReasonTruncated},
		{name: "oversized packet with fd", data: append(marshal(t, addReq("u5")), make([]byte, MaxMessageSize)...), nfds: 1, reason: ReasonTruncated},
		{name: "not protobuf", data: []byte{0xff, 0xff, 0xff}, reason: ReasonDecode},
		{name: "truncated protobuf", data: marshal(t, addReq("u6"))[:5], nfds: 1, reason: ReasonDecode},
		{name: "unknown payload", data: unknownPayload, reason: ReasonUnknownPayload},
		{name: "unknown payload with fd", data: unknownPayload, nfds: 1, reason: ReasonUnknownPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			agent, zt := seqpacketPair(t)
			var fds []int
			for range tc.nfds {
				fds = append(fds, devnull(t))
			}
			before := openFDCount(t)
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
			}
			if _, _, err := agent.WriteMsgUnix(tc.data, oob, nil); err != nil {
				t.Fatal(err)
			}
			req, err := ReadRequest(zt)
			if tc.reason != "" {
				var perr *Error
				if !errors.As(err, &perr) || perr.Reason != tc.reason {
					t.Fatalf("err = %v, want reason %s", err, tc.reason)
				}
				if req.FD != -1 {
					t.Fatalf("FD = %d on error", req.FD)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if req.Kind != tc.want || req.UID != tc.wantUID || (req.Info != nil) != tc.wantInfo {
					t.Fatalf("got %+v", req)
				}
				if (req.FD >= 0) != (tc.want == KindAdd) {
					t.Fatalf("FD = %d for %s", req.FD, req.Kind)
				}
				if req.FD >= 0 {
					unix.Close(req.FD)
				}
			}
			if after := openFDCount(t); after != before {
				t.Fatalf("open fds %d → %d: received fds leaked", before, after)
			}
		})
	}
}

func TestReadRequestEOF(t *testing.T) {
	agent, zt := seqpacketPair(t)
	agent.Close()
	_, err := ReadRequest(zt)
	var perr *Error
	if !errors.Is(err, io.EOF) || errors.As(err, &perr) {
		t.Fatalf("err = %v, want a connection error wrapping EOF", err)
	}
}

func TestWriteMsgRoundTrip(t *testing.T) {
	agent, zt := seqpacketPair(t)
	if err := WriteMsg(zt, &zdspb.ZdsHello{Version: zdspb.Version_V1}); err != nil {
		t.Fatal(err)
	}
	var hello zdspb.ZdsHello
	if err := ReadMsg(agent, &hello); err != nil {
		t.Fatal(err)
	}
	if hello.GetVersion() != zdspb.Version_V1 {
		t.Fatalf("version %v", hello.GetVersion())
	}
	big := &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: string(make([]byte, MaxMessageSize))}}}
	if err := WriteMsg(zt, big); err == nil {
		t.Fatal("oversized write succeeded")
	}
}

// FuzzDecodeRequest: any packet, flags and FD count gives a Request or an
// *Error, never a panic, and every FD not handed out is closed.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(marshal(f, addReq("uid")), uint8(0), uint8(1))
	f.Add(marshal(f, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: "x"}}}), uint8(0), uint8(0))
	f.Add([]byte{0x48, 0x01}, uint8(0), uint8(2))
	f.Add([]byte{0x0a, 0x05, 0x0a}, uint8(1), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, flagBits uint8, nfds uint8) {
		flags := 0
		if flagBits&1 != 0 {
			flags |= unix.MSG_TRUNC
		}
		if flagBits&2 != 0 {
			flags |= unix.MSG_CTRUNC
		}
		var fds []int
		for range nfds % 4 {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			fds = append(fds, fd)
		}
		req, err := decodeRequest(data, flags, append([]int(nil), fds...))
		if err != nil {
			var perr *Error
			if !errors.As(err, &perr) {
				t.Fatalf("error %v is not an *Error", err)
			}
			if req.FD != -1 {
				t.Fatalf("FD %d with error", req.FD)
			}
		}
		for _, fd := range fds {
			if fd == req.FD {
				continue
			}
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
				t.Fatalf("fd %d left open", fd)
			}
		}
		if req.FD >= 0 {
			unix.Close(req.FD)
		}
	})
}
