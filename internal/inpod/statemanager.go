package inpod

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// startTimeout bounds one StartPod call: istio-cni waits 5 s for each Ack and
// then moves on, so a later Ack would be taken as the answer to the next
// request. Staying below it keeps requests and Acks paired.
const startTimeout = 4 * time.Second

// podEntry is a running (or draining) pod proxy.
type podEntry struct {
	uid  string
	info WorkloadInfo
	ns   *Netns
	pod  Pod
}

// pendingEntry is a pod whose proxy is starting or failed to start.
type pendingEntry struct {
	info WorkloadInfo
	ns   *Netns
}

// stateManager is the pod state machine. Its request methods are called by
// one goroutine (the client loop) at a time; the maps are also read by the
// admin dump and so are guarded by mu. It never touches the ZDS socket.
type stateManager struct {
	// immutable after construction
	server   PodServer
	log      *slog.Logger
	metrics  *metrics
	newNetns func(fd int) (*Netns, error)

	// owned by the calling goroutine, reset on every new connection
	snapshotReceived bool
	snapshotNames    map[string]struct{} // uids named by Add/Keep before SnapshotSent

	mu       sync.Mutex
	pods     map[string]*podEntry     // guarded by mu
	pending  map[string]*pendingEntry // guarded by mu
	draining map[*podEntry]struct{}   // guarded by mu: removed, Drain still running

	drains sync.WaitGroup // goroutines draining removed pods
}

func newStateManager(server PodServer, log *slog.Logger, m *metrics, newNetns func(int) (*Netns, error)) *stateManager {
	return &stateManager{
		server: server, log: log, metrics: m, newNetns: newNetns,
		snapshotNames: map[string]struct{}{},
		pods:          map[string]*podEntry{},
		pending:       map[string]*pendingEntry{},
		draining:      map[*podEntry]struct{}{},
	}
}

// handle applies one request. A non-nil error is always an *Error and goes
// back to the agent as the Ack text.
func (s *stateManager) handle(ctx context.Context, r Request) error {
	switch r.Kind {
	case KindAdd:
		return s.add(ctx, r)
	case KindKeep:
		return s.keep(r.UID)
	case KindDel:
		return s.del(r.UID)
	case KindSnapshotSent:
		return s.snapshotSent()
	}
	closeFDs([]int{r.FD})
	return reject(ReasonUnknownPayload, r.UID, "request kind %s", r.Kind)
}

// add starts a pod's proxy. Repeating an Add for the same uid and the same
// namespace changes nothing; an Add with another namespace (the sandbox was
// re-created) drains the old proxy and starts a new one, as upstream.
func (s *stateManager) add(ctx context.Context, r Request) error {
	if r.UID == "" {
		closeFDs([]int{r.FD})
		return reject(ReasonMissingUID, "", "add without a uid")
	}
	if r.Info == nil {
		closeFDs([]int{r.FD})
		return reject(ReasonMissingInfo, r.UID, "workload_info is required")
	}
	ns, err := s.newNetns(r.FD)
	if err != nil {
		return &Error{Reason: ReasonNotNetns, UID: r.UID, Err: err}
	}
	if !s.snapshotReceived {
		s.snapshotNames[r.UID] = struct{}{}
	}
	info := workloadInfoFrom(r.Info)

	s.mu.Lock()
	if cur, ok := s.pods[r.UID]; ok {
		if cur.ns.ID() == ns.ID() {
			s.mu.Unlock()
			_ = ns.Close()
			s.log.Debug("pod already running", "uid", r.UID, "netns", ns.ID())
			return nil
		}
		s.log.Info("pod re-added with a new netns, replacing its proxy", "uid", r.UID, "old", cur.ns.ID(), "new", ns.ID())
		s.removeLocked(r.UID)
	}
	s.setPendingLocked(r.UID, &pendingEntry{info: info, ns: ns})
	s.updateGaugesLocked()
	s.mu.Unlock()

	s.log.Info("pod received, starting proxy", "uid", r.UID, "name", info.Name, "namespace", info.Namespace, "netns", ns.ID())
	return s.start(ctx, r.UID, info, ns)
}

// start runs StartPod for a pending pod and moves it to running on success.
func (s *stateManager) start(ctx context.Context, uid string, info WorkloadInfo, ns *Netns) error {
	sctx, cancel := context.WithTimeout(ctx, startTimeout)
	pod, err := s.server.StartPod(sctx, uid, info, ns)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.updateGaugesLocked()
	p, stillPending := s.pending[uid]
	if err != nil {
		return &Error{Reason: ReasonStartFailed, UID: uid, Err: err}
	}
	if !stillPending || p.ns != ns {
		// Cannot happen with one caller goroutine; if it ever does, the pod
		// was deleted meanwhile: do not keep the proxy.
		s.drainLocked(&podEntry{uid: uid, info: info, ns: nil, pod: pod})
		return nil
	}
	delete(s.pending, uid)
	s.pods[uid] = &podEntry{uid: uid, info: info, ns: ns, pod: pod}
	s.metrics.started.Inc()
	return nil
}

// keep marks a running pod as part of the snapshot being sent.
func (s *stateManager) keep(uid string) error {
	if s.snapshotReceived {
		return reject(ReasonKeepAfterSnapshot, uid, "keep is only valid before SnapshotSent")
	}
	s.mu.Lock()
	_, running := s.pods[uid]
	s.mu.Unlock()
	if !running {
		return reject(ReasonKeepUnknown, uid, "no proxy runs for this pod")
	}
	s.snapshotNames[uid] = struct{}{}
	return nil
}

// del removes a pod. Unknown uids are fine (deletes are idempotent and sent
// to every connected ztunnel). Before SnapshotSent a running pod is only
// dropped from the snapshot, so reconciliation removes it, as upstream.
func (s *stateManager) del(uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropPendingLocked(uid)
	if !s.snapshotReceived {
		delete(s.snapshotNames, uid)
	} else {
		s.removeLocked(uid)
	}
	s.updateGaugesLocked()
	return nil
}

// snapshotSent removes every pod the agent did not name since the
// connection started: those were deleted while ztunnel was disconnected.
func (s *stateManager) snapshotSent() error {
	if s.snapshotReceived {
		return reject(ReasonDuplicateSnapshot, "", "snapshot already received on this connection")
	}
	s.mu.Lock()
	for uid := range s.pods {
		if _, ok := s.snapshotNames[uid]; !ok {
			s.log.Info("pod not in snapshot, removing", "uid", uid)
			s.removeLocked(uid)
		}
	}
	s.updateGaugesLocked()
	s.mu.Unlock()
	clear(s.snapshotNames)
	s.snapshotReceived = true
	return nil
}

// resetSnapshot starts a new connection: the agent will resend its whole
// cache, pending pods included.
func (s *stateManager) resetSnapshot() {
	clear(s.snapshotNames)
	s.snapshotReceived = false
	s.mu.Lock()
	for uid := range s.pending {
		s.dropPendingLocked(uid)
	}
	s.updateGaugesLocked()
	s.mu.Unlock()
}

// retryPending tries to start every pending pod again.
func (s *stateManager) retryPending(ctx context.Context) {
	s.mu.Lock()
	todo := make(map[string]*pendingEntry, len(s.pending))
	for uid, p := range s.pending {
		todo[uid] = p
	}
	s.mu.Unlock()
	for uid, p := range todo {
		if err := s.start(ctx, uid, p.info, p.ns); err != nil {
			s.log.Info("retrying pod failed", "uid", uid, "err", err)
		} else {
			s.log.Info("pending pod started", "uid", uid)
		}
	}
}

func (s *stateManager) havePending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending) > 0
}

// ready: the first snapshot of this connection is in and no pod waits for
// its proxy (upstream's readiness rule).
func (s *stateManager) ready() bool { return s.snapshotReceived && !s.havePending() }

func (s *stateManager) setPendingLocked(uid string, p *pendingEntry) {
	if old, ok := s.pending[uid]; ok && old.ns != p.ns {
		_ = old.ns.Close()
	}
	s.pending[uid] = p
}

func (s *stateManager) dropPendingLocked(uid string) {
	if p, ok := s.pending[uid]; ok {
		_ = p.ns.Close()
		delete(s.pending, uid)
	}
}

// removeLocked stops a running pod immediately, in the background.
func (s *stateManager) removeLocked(uid string) {
	p, ok := s.pods[uid]
	if !ok {
		return
	}
	delete(s.pods, uid)
	s.drainLocked(p)
}

func (s *stateManager) drainLocked(p *podEntry) {
	s.draining[p] = struct{}{}
	s.drains.Go(func() {
		// A done context: the pod is gone, so there is nothing to wait for.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := p.pod.Drain(ctx); err != nil {
			s.log.Debug("pod drain", "uid", p.uid, "err", err)
		}
		s.finishDrain(p)
	})
}

func (s *stateManager) finishDrain(p *podEntry) {
	if p.ns != nil {
		_ = p.ns.Close()
	}
	s.mu.Lock()
	delete(s.draining, p)
	s.mu.Unlock()
	s.metrics.stopped.Inc()
}

func (s *stateManager) updateGaugesLocked() {
	s.metrics.active.Set(float64(len(s.pods)))
	s.metrics.pending.Set(float64(len(s.pending)))
}

// drainAll drains every running pod gracefully (until ctx is done), waits
// for pods removed earlier, and releases pending namespaces.
func (s *stateManager) drainAll(ctx context.Context) error {
	s.mu.Lock()
	pods := make([]*podEntry, 0, len(s.pods))
	for uid, p := range s.pods {
		pods = append(pods, p)
		delete(s.pods, uid)
		s.draining[p] = struct{}{}
	}
	for uid := range s.pending {
		s.dropPendingLocked(uid)
	}
	s.updateGaugesLocked()
	s.mu.Unlock()

	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() {
			if err := p.pod.Drain(ctx); err != nil {
				errs[i] = fmt.Errorf("inpod: drain pod %s: %w", p.uid, err)
			}
			s.finishDrain(p)
		})
	}
	wg.Wait()
	s.drains.Wait()
	return errors.Join(errs...)
}
