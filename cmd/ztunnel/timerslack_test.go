package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// threadSlacks is the timer slack of every thread of pid, in nanoseconds.
func threadSlacks(t *testing.T, pid int) []int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var out []int
	for _, task := range tasks {
		// Only /proc/<tid> has the file, not /proc/<pid>/task/<tid>.
		f := "/proc/" + filepath.Base(task) + "/timerslack_ns"
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %q", f, b)
		}
		out = append(out, n)
	}
	return out
}

// TestTimerSlack: ztunnel re-executes itself once so that every thread,
// the runtime's sysmon included, runs with ZTUNNEL_TIMER_SLACK (1ms by
// default); 0 leaves the slack it was started with.
func TestTimerSlack(t *testing.T) {
	inherited, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  string
		want int
	}{{"", 1_000_000}, {"ZTUNNEL_TIMER_SLACK=200us", 200_000}, {"ZTUNNEL_TIMER_SLACK=0", inherited}} {
		p := startZtunnel(t, "FAKE_CA=true", "XDS_ADDRESS=", tc.env)
		slacks := threadSlacks(t, p.cmd.Process.Pid)
		for _, s := range slacks {
			if s != tc.want {
				t.Errorf("%q: thread timer slacks %v, want all %d", tc.env, slacks, tc.want)
				break
			}
		}
		if len(slacks) < 2 {
			t.Errorf("%q: %d threads, want the runtime's too", tc.env, len(slacks))
		}
		p.cmd.Process.Kill()
		<-p.done
	}
}
