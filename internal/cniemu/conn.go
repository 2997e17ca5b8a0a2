package cniemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// conn is one connected ztunnel. All I/O on it happens in serve, so requests
// and Acks never interleave (Acks are matched to requests only by order).
type conn struct {
	id      int
	uc      *net.UnixConn
	updates chan update
	done    chan struct{} // closed when serve has returned
}

// update is one request to send; serve owns fds once it receives it.
type update struct {
	msg  *zdspb.WorkloadRequest // or raw
	raw  []byte
	kind inpod.Kind
	uid  string
	fds  []int
	resp chan result
}

type result struct {
	resp *zdspb.WorkloadResponse
	err  error
}

// send hands u to the connection's goroutine and waits for the Ack.
func (c *conn) send(ctx context.Context, u update) (*zdspb.WorkloadResponse, error) {
	u.resp = make(chan result, 1)
	select {
	case c.updates <- u:
	case <-ctx.Done():
		closeAll(u.fds)
		return nil, fmt.Errorf("cniemu: request not sent: %w", ctx.Err())
	case <-c.done:
		closeAll(u.fds)
		return nil, errors.New("cniemu: connection closed before request sent")
	}
	select {
	case r := <-u.resp:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("cniemu: no response: %w", ctx.Err())
	case <-c.done:
		select {
		case r := <-u.resp:
			return r.resp, r.err
		default:
			return nil, errors.New("cniemu: connection closed before response received")
		}
	}
}

// snapItem is one pod of a snapshot, with its own dup of the netns FD.
type snapItem struct {
	uid  string
	info *zdspb.WorkloadInfo
	fd   int // -1: send Keep
}

func (s *Server) snapshot() ([]snapItem, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := make([]snapItem, 0, len(s.order))
	for _, uid := range s.order {
		p := s.pods[uid]
		it := snapItem{uid: uid, info: p.info, fd: -1}
		if p.netns != nil {
			d, err := unix.FcntlInt(p.netns.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				for _, x := range items {
					closeAll([]int{x.fd})
				}
				return nil, fmt.Errorf("cniemu: dup netns fd: %w", err)
			}
			it.fd = d
		}
		items = append(items, it)
	}
	return items, nil
}

// serve runs istio-cni's connection sequence: hello, snapshot (Add with FD,
// or Keep, one Ack each), SnapshotSent, then live updates and keepalive
// probes.
func (s *Server) serve(ctx context.Context, c *conn) error {
	var hello zdspb.ZdsHello
	_ = c.uc.SetReadDeadline(time.Now().Add(s.opts.AckTimeout))
	if err := inpod.ReadMsg(c.uc, &hello); err != nil {
		return fmt.Errorf("cniemu: read hello: %w", err)
	}
	s.log.Info("received hello from ztunnel", "conn", c.id, "version", hello.GetVersion())

	items, err := s.snapshot()
	if err != nil {
		return err
	}
	for i, it := range items {
		var req *zdspb.WorkloadRequest
		kind, fds := inpod.KindAdd, []int{it.fd}
		if it.fd >= 0 {
			req = &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: it.uid, WorkloadInfo: it.info}}}
		} else {
			kind, fds = inpod.KindKeep, nil
			req = &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: it.uid}}}
		}
		resp, err := c.exchange(req, nil, fds, s.opts.AckTimeout)
		closeAll(fds)
		if err != nil {
			for _, rest := range items[i+1:] {
				closeAll([]int{rest.fd})
			}
			return err
		}
		s.record(AckRecord{Conn: c.id, Kind: kind, UID: it.uid, Error: resp.GetAck().GetError()}, false)
	}
	resp, err := c.exchange(&zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}, nil, nil, s.opts.AckTimeout)
	if err != nil {
		return err
	}
	s.record(AckRecord{Conn: c.id, Kind: inpod.KindSnapshotSent, Error: resp.GetAck().GetError()}, true)
	s.log.Debug("snapshot sent to ztunnel", "conn", c.id, "pods", len(items))

	probe := time.NewTicker(s.opts.KeepaliveInterval)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-c.updates:
			resp, err := c.exchange(u.msg, u.raw, u.fds, s.opts.AckTimeout)
			closeAll(u.fds)
			if err == nil {
				s.record(AckRecord{Conn: c.id, Kind: u.kind, UID: u.uid, Error: resp.GetAck().GetError()}, false)
			}
			u.resp <- result{resp, err}
			if err != nil {
				return err
			}
		case <-probe.C:
			var resp zdspb.WorkloadResponse
			_ = c.uc.SetReadDeadline(time.Now().Add(probeTimeout))
			err := inpod.ReadMsg(c.uc, &resp)
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				// alive and quiet, as it should be
			case errors.Is(err, io.EOF):
				return nil
			case err == nil:
				return errors.New("cniemu: ztunnel protocol error, unexpected message")
			default:
				return err
			}
		}
	}
}

// exchange writes one request and reads its Ack.
func (c *conn) exchange(msg *zdspb.WorkloadRequest, raw []byte, fds []int, timeout time.Duration) (*zdspb.WorkloadResponse, error) {
	data := raw
	if msg != nil {
		var err error
		if data, err = proto.Marshal(msg); err != nil {
			return nil, fmt.Errorf("cniemu: encode: %w", err)
		}
	}
	_ = c.uc.SetWriteDeadline(time.Now().Add(timeout))
	// Written directly, not with inpod.WriteRaw, so tests can send packets
	// larger than ztunnel accepts.
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.uc.WriteMsgUnix(data, oob, nil); err != nil {
		return nil, fmt.Errorf("cniemu: send: %w", err)
	}
	var resp zdspb.WorkloadResponse
	_ = c.uc.SetReadDeadline(time.Now().Add(timeout))
	if err := inpod.ReadMsg(c.uc, &resp); err != nil {
		return nil, fmt.Errorf("cniemu: wait for ack: %w", err)
	}
	return &resp, nil
}
