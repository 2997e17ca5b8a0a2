package inpod

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// fakeFDBase keeps fake FD numbers far from real ones: closing them is a
// harmless EBADF.
const fakeFDBase = 1 << 20

// notNetnsFD is a fake FD the fake validator rejects.
const notNetnsFD = fakeFDBase - 1

type fakePod struct {
	srv  *fakeServer
	uid  string
	ns   NetnsID
	mu   sync.Mutex
	done bool
}

func (p *fakePod) Drain(ctx context.Context) error {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
	p.srv.mu.Lock()
	defer p.srv.mu.Unlock()
	p.srv.drained = append(p.srv.drained, drainRecord{uid: p.uid, ns: p.ns, immediate: ctx.Err() != nil})
	return nil
}

type drainRecord struct {
	uid       string
	ns        NetnsID
	immediate bool
}

type fakeServer struct {
	mu      sync.Mutex
	fail    map[string]error // uid → StartPod error
	starts  []string
	drained []drainRecord
}

func (f *fakeServer) StartPod(ctx context.Context, uid string, info WorkloadInfo, ns *Netns) (Pod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, uid)
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("StartPod called without a deadline")
	}
	if err := f.fail[uid]; err != nil {
		return nil, err
	}
	return &fakePod{srv: f, uid: uid, ns: ns.ID()}, nil
}

func newTestState(t *testing.T, srv *fakeServer) *stateManager {
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newStateManager(srv, slog.New(slog.DiscardHandler), m, func(fd int) (*Netns, error) {
		if fd == notNetnsFD {
			return nil, errors.New("fd is not a network namespace")
		}
		return &Netns{id: NetnsID{Dev: 1, Inode: uint64(fd)}, fd: -1}, nil
	})
}

// step is one request (or test action) in a scripted session.
type step struct {
	op     string // add, keep, del, snap, reset, retry, fix
	uid    string
	ns     int // fake netns number for add
	noInfo bool
	reason Reason // expected rejection; "" = ack ok
}

func TestStateMachine(t *testing.T) {
	boom := errors.New("port 15008 in use")
	cases := []struct {
		name        string
		fail        map[string]error
		steps       []step
		wantRunning []string
		wantPending []string
		wantStarts  int
		wantDrained []string // uids drained, in order
		wantReady   bool
	}{
		{name: "add before snapshot starts the proxy, not ready yet",
			steps:       []step{{op: "add", uid: "a", ns: 1}},
			wantRunning: []string{"a"}, wantStarts: 1},
		{name: "ready after snapshot",
			steps:       []step{{op: "add", uid: "a", ns: 1}, {op: "snap"}},
			wantRunning: []string{"a"}, wantStarts: 1, wantReady: true},
		{name: "empty snapshot is ready",
			steps:     []step{{op: "snap"}},
			wantReady: true},
		{name: "duplicate add with the same netns is a no-op",
			steps:       []step{{op: "snap"}, {op: "add", uid: "a", ns: 1}, {op: "add", uid: "a", ns: 1}},
			wantRunning: []string{"a"}, wantStarts: 1, wantReady: true},
		{name: "add with a new netns replaces the proxy",
			steps:       []step{{op: "snap"}, {op: "add", uid: "a", ns: 1}, {op: "add", uid: "a", ns: 2}},
			wantRunning: []string{"a"}, wantStarts: 2, wantDrained: []string{"a"}, wantReady: true},
		{name: "add without workload info",
			steps:     []step{{op: "add", uid: "a", ns: 1, noInfo: true, reason: ReasonMissingInfo}, {op: "snap"}},
			wantReady: true},
		{name: "add without uid",
			steps:     []step{{op: "add", ns: 1, reason: ReasonMissingUID}, {op: "snap"}},
			wantReady: true},
		{name: "add with an fd that is not a netns",
			steps:     []step{{op: "snap"}, {op: "add", uid: "a", ns: notNetnsFD - fakeFDBase, reason: ReasonNotNetns}},
			wantReady: true},
		{name: "keep for an unknown uid",
			steps:     []step{{op: "keep", uid: "ghost", reason: ReasonKeepUnknown}, {op: "snap"}},
			wantReady: true},
		{name: "keep after snapshot",
			steps:       []step{{op: "add", uid: "a", ns: 1}, {op: "snap"}, {op: "keep", uid: "a", reason: ReasonKeepAfterSnapshot}},
			wantRunning: []string{"a"}, wantStarts: 1, wantReady: true},
		{name: "second snapshot on one connection",
			steps:     []step{{op: "snap"}, {op: "snap", reason: ReasonDuplicateSnapshot}},
			wantReady: true},
		{name: "del of an unknown uid is fine",
			steps:     []step{{op: "snap"}, {op: "del", uid: "ghost"}},
			wantReady: true},
		{name: "del after snapshot drains immediately",
			steps:      []step{{op: "snap"}, {op: "add", uid: "a", ns: 1}, {op: "del", uid: "a"}},
			wantStarts: 1, wantDrained: []string{"a"}, wantReady: true},
		{name: "del before snapshot removes the pod at snapshot",
			steps:      []step{{op: "add", uid: "a", ns: 1}, {op: "del", uid: "a"}, {op: "snap"}},
			wantStarts: 1, wantDrained: []string{"a"}, wantReady: true},
		{name: "reconnect: kept and re-added pods stay, others are removed",
			steps: []step{
				{op: "add", uid: "a", ns: 1}, {op: "add", uid: "b", ns: 2}, {op: "add", uid: "c", ns: 3}, {op: "snap"},
				{op: "reset"}, {op: "keep", uid: "a"}, {op: "add", uid: "c", ns: 3}, {op: "snap"},
			},
			wantRunning: []string{"a", "c"}, wantStarts: 3, wantDrained: []string{"b"}, wantReady: true},
		{name: "not ready between reset and snapshot",
			steps:       []step{{op: "add", uid: "a", ns: 1}, {op: "snap"}, {op: "reset"}, {op: "keep", uid: "a"}},
			wantRunning: []string{"a"}, wantStarts: 1},
		{name: "failed start is pending and blocks readiness",
			fail:        map[string]error{"a": boom},
			steps:       []step{{op: "add", uid: "a", ns: 1, reason: ReasonStartFailed}, {op: "snap"}},
			wantPending: []string{"a"}, wantStarts: 1},
		{name: "pending pod started by retry",
			fail: map[string]error{"a": boom},
			steps: []step{{op: "add", uid: "a", ns: 1, reason: ReasonStartFailed}, {op: "snap"},
				{op: "fix", uid: "a"}, {op: "retry"}},
			wantRunning: []string{"a"}, wantStarts: 2, wantReady: true},
		{name: "pending pod deleted",
			fail: map[string]error{"a": boom},
			steps: []step{{op: "snap"}, {op: "add", uid: "a", ns: 1, reason: ReasonStartFailed},
				{op: "del", uid: "a"}, {op: "retry"}},
			wantStarts: 1, wantReady: true},
		{name: "pending pods are forgotten on reconnect",
			fail: map[string]error{"a": boom},
			steps: []step{{op: "add", uid: "a", ns: 1, reason: ReasonStartFailed}, {op: "snap"},
				{op: "reset"}, {op: "snap"}},
			wantStarts: 1, wantReady: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := &fakeServer{fail: map[string]error{}}
			for k, v := range tc.fail {
				srv.fail[k] = v
			}
			s := newTestState(t, srv)
			ctx := context.Background()
			for i, st := range tc.steps {
				var err error
				switch st.op {
				case "add":
					var info *zdspb.WorkloadInfo
					if !st.noInfo {
						info = &zdspb.WorkloadInfo{Name: st.uid, Namespace: "ns", ServiceAccount: "sa"}
					}
					err = s.handle(ctx, Request{Kind: KindAdd, UID: st.uid, Info: info, FD: fakeFDBase + st.ns})
				case "keep":
					err = s.handle(ctx, Request{Kind: KindKeep, UID: st.uid, FD: -1})
				case "del":
					err = s.handle(ctx, Request{Kind: KindDel, UID: st.uid, FD: -1})
				case "snap":
					err = s.handle(ctx, Request{Kind: KindSnapshotSent, FD: -1})
				case "reset":
					s.resetSnapshot()
				case "retry":
					s.retryPending(ctx)
				case "fix":
					srv.mu.Lock()
					delete(srv.fail, st.uid)
					srv.mu.Unlock()
				}
				var perr *Error
				switch {
				case st.reason == "" && err != nil:
					t.Fatalf("step %d %s %s: unexpected error %v", i, st.op, st.uid, err)
				case st.reason != "" && (!errors.As(err, &perr) || perr.Reason != st.reason):
					t.Fatalf("step %d %s %s: error %v, want reason %s", i, st.op, st.uid, err, st.reason)
				}
			}
			s.drains.Wait()
			dump := s.dump()
			var running, pending []string
			for uid, ps := range dump {
				if ps.State == PhaseUp {
					running = append(running, uid)
				} else {
					pending = append(pending, uid)
				}
			}
			sort.Strings(running)
			sort.Strings(pending)
			if !slices.Equal(running, tc.wantRunning) || !slices.Equal(pending, tc.wantPending) {
				t.Fatalf("running %v pending %v, want %v %v", running, pending, tc.wantRunning, tc.wantPending)
			}
			srv.mu.Lock()
			var drained []string
			for _, d := range srv.drained {
				if !d.immediate {
					t.Errorf("pod %s removed with a graceful drain; want immediate", d.uid)
				}
				drained = append(drained, d.uid)
			}
			starts := len(srv.starts)
			srv.mu.Unlock()
			if starts != tc.wantStarts {
				t.Errorf("StartPod called %d times, want %d", starts, tc.wantStarts)
			}
			if !slices.Equal(drained, tc.wantDrained) {
				t.Errorf("drained %v, want %v", drained, tc.wantDrained)
			}
			if s.ready() != tc.wantReady {
				t.Errorf("ready = %v, want %v", s.ready(), tc.wantReady)
			}
			// Shutdown drains the rest gracefully.
			if err := s.drainAll(ctx); err != nil {
				t.Fatal(err)
			}
			if d := s.dump(); len(d) != 0 {
				t.Fatalf("after drainAll: %v", d)
			}
		})
	}
}

func TestReplacedPodKeepsNewNetns(t *testing.T) {
	srv := &fakeServer{fail: map[string]error{}}
	s := newTestState(t, srv)
	ctx := context.Background()
	info := &zdspb.WorkloadInfo{Name: "a"}
	for _, ns := range []int{1, 2} {
		if err := s.handle(ctx, Request{Kind: KindAdd, UID: "a", Info: info, FD: fakeFDBase + ns}); err != nil {
			t.Fatal(err)
		}
	}
	s.drains.Wait()
	s.mu.Lock()
	got := s.pods["a"].ns.ID().Inode
	s.mu.Unlock()
	if got != fakeFDBase+2 {
		t.Fatalf("running pod netns inode %d, want the second one", got)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.drained) != 1 || srv.drained[0].ns.Inode != fakeFDBase+1 {
		t.Fatalf("drained %+v, want the first netns", srv.drained)
	}
}

func TestWorkloadStateShape(t *testing.T) {
	srv := &fakeServer{fail: map[string]error{"uid2": errors.New("boom")}}
	s := newTestState(t, srv)
	ctx := context.Background()
	info := &zdspb.WorkloadInfo{Name: "name", Namespace: "ns", ServiceAccount: "sa"}
	_ = s.handle(ctx, Request{Kind: KindAdd, UID: "uid1", Info: info, FD: fakeFDBase + 1})
	_ = s.handle(ctx, Request{Kind: KindAdd, UID: "uid2", Info: info, FD: fakeFDBase + 2})
	got, err := json.Marshal(s.dump())
	if err != nil {
		t.Fatal(err)
	}
	// upstream's src/inpod/admin.rs test output, one entry per phase
	want := `{"uid1":{"info":{"name":"name","namespace":"ns","serviceAccount":"sa"},"state":"Up"},` +
		`"uid2":{"info":{"name":"name","namespace":"ns","serviceAccount":"sa"},"state":"Pending"}}`
	if string(got) != want {
		t.Fatalf("dump\n got %s\nwant %s", got, want)
	}
	if err := s.drainAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(s.dump()); string(got) != "{}" {
		t.Fatalf("after drain: %s", got)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	srv := &fakeServer{fail: map[string]error{"bad": errors.New("boom")}}
	s := newStateManager(srv, slog.New(slog.DiscardHandler), m, func(fd int) (*Netns, error) {
		return &Netns{id: NetnsID{Inode: uint64(fd)}, fd: -1}, nil
	})
	ctx := context.Background()
	info := &zdspb.WorkloadInfo{Name: "x"}
	_ = s.handle(ctx, Request{Kind: KindAdd, UID: "a", Info: info, FD: fakeFDBase + 1})
	_ = s.handle(ctx, Request{Kind: KindAdd, UID: "bad", Info: info, FD: fakeFDBase + 2})
	_ = s.handle(ctx, Request{Kind: KindSnapshotSent, FD: -1})
	_ = s.handle(ctx, Request{Kind: KindDel, UID: "a", FD: -1})
	s.drains.Wait()
	for name, tc := range map[string]struct {
		c    prometheus.Collector
		want float64
	}{
		"active":  {m.active, 0},
		"pending": {m.pending, 1},
		"started": {m.started, 1},
		"stopped": {m.stopped, 1},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%s = %v, want %v", name, got, tc.want)
		}
	}
	if err := s.drainAll(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.pending); got != 0 {
		t.Errorf("pending after drainAll = %v", got)
	}
}
