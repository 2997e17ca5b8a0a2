package inpod

// ProxyPhase is the state of one pod's proxy in the workloadState dump.
type ProxyPhase string

// Phases, spelled as upstream's serde output.
const (
	// PhasePending: the proxy is starting, or failed to start and waits for
	// a retry.
	PhasePending ProxyPhase = "Pending"
	// PhaseUp: the proxy is serving (or draining after the pod was removed).
	PhaseUp ProxyPhase = "Up"
)

// ProxyState is one entry of the workloadState dump, keyed by pod uid:
//
//	{"uid1":{"info":{"name":"n","namespace":"ns","serviceAccount":"sa"},"state":"Up"}}
//
// Fields are in key order, as upstream's JSON (a sorted map) has them.
type ProxyState struct {
	Connections any          `json:"connections,omitempty"`
	Info        WorkloadInfo `json:"info"`
	State       ProxyPhase   `json:"state"`
}

// dump builds the workloadState section. Draining pods stay "Up" until their
// drain ends, unless a newer proxy for the same uid is already listed.
func (s *stateManager) dump() map[string]ProxyState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]ProxyState, len(s.pods)+len(s.pending))
	for d := range s.draining {
		out[d.uid] = d.proxyState()
	}
	for uid, p := range s.pods {
		out[uid] = p.proxyState()
	}
	for uid, p := range s.pending {
		out[uid] = ProxyState{Info: p.info, State: PhasePending}
	}
	return out
}

func (p *podEntry) proxyState() ProxyState {
	ps := ProxyState{Info: p.info, State: PhaseUp}
	if cd, ok := p.pod.(ConnectionDumper); ok {
		ps.Connections = cd.DumpConnections()
	}
	return ps
}
