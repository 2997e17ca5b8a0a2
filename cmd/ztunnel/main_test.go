package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ztunnel-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ztunnel")
	// Built as the image builds it (deploy/daemonset/Dockerfile): static,
	// so the memory figures are those of what ships.
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a running ztunnel with the addresses it logged.
type process struct {
	cmd   *exec.Cmd
	addrs map[string]string // server name → host:port
	lines chan string
	done  chan error
}

var listenLine = regexp.MustCompile(`msg=listening .*server=(\w+) addr=(\S+)`)

func startZtunnel(t *testing.T, env ...string) *process {
	t.Helper()
	cmd := exec.Command(binary)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"ADMIN_ADDR=127.0.0.1:0", "STATS_ADDR=127.0.0.1:0", "READINESS_ADDR=127.0.0.1:0",
		"INPOD_UDS=" + filepath.Join(t.TempDir(), "ztunnel.sock")}, env...) // later entries win
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, addrs: map[string]string{}, lines: make(chan string, 1000), done: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := listenLine.FindStringSubmatch(line); m != nil {
				p.addrs[m[1]] = m[2]
				if len(p.addrs) == 3 {
					close(ready)
				}
			}
			select {
			case p.lines <- line:
			default:
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	select {
	case <-ready:
	case err := <-p.done:
		t.Fatalf("ztunnel exited early: %v\n%s", err, drain(p.lines))
	case <-time.After(20 * time.Second):
		t.Fatalf("ztunnel did not start listening\n%s", drain(p.lines))
	}
	return p
}

func drain(c chan string) string {
	var b strings.Builder
	for {
		select {
		case l := <-c:
			b.WriteString(l + "\n")
		default:
			return b.String()
		}
	}
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func TestLocalConfigDumpAndSIGTERM(t *testing.T) {
	p := startZtunnel(t, "LOCAL_XDS_PATH=../../examples/localhost.yaml", "FAKE_CA=true", "XDS_ADDRESS=")
	code, body := get(t, "http://"+p.addrs["admin"]+"/config_dump")
	if code != 200 {
		t.Fatalf("config_dump = %d %s", code, body)
	}
	var dump struct {
		Workloads    []map[string]any `json:"workloads"`
		Services     []map[string]any `json:"services"`
		Policies     []map[string]any `json:"policies"`
		Certificates []any            `json:"certificates"`
		Config       map[string]any   `json:"config"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		t.Fatalf("config_dump is not JSON: %v", err)
	}
	if len(dump.Workloads) != 2 || len(dump.Services) != 2 || len(dump.Policies) != 1 {
		t.Fatalf("dump has %d workloads, %d services, %d policies; want 2, 2, 1:\n%s",
			len(dump.Workloads), len(dump.Services), len(dump.Policies), body)
	}
	if dump.Certificates == nil || dump.Config["fakeCa"] != true {
		t.Fatalf("dump certificates=%v config=%v", dump.Certificates, dump.Config)
	}
	if code, _ := get(t, "http://"+p.addrs["stats"]+"/metrics"); code != 200 {
		t.Fatalf("metrics = %d", code)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, drain(p.lines))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ztunnel did not exit within 15s of SIGTERM")
	}
}

func TestQuitQuitQuitExitsZero(t *testing.T) {
	p := startZtunnel(t, "FAKE_CA=true", "XDS_ADDRESS=")
	resp, err := http.Post("http://"+p.addrs["admin"]+"/quitquitquit", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("exit after /quitquitquit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ztunnel did not exit after /quitquitquit")
	}
}

func TestBadConfigFailsWithOneLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary)
	cmd.Env = []string{"PROXY_MODE=sidecar"}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit = %v, want status 1; output %q", err, out)
	}
	want := "ztunnel: config: PROXY_MODE=\"sidecar\": must be one of shared, dedicated\n"
	if string(out) != want {
		t.Fatalf("output = %q, want %q", out, want)
	}
}

func TestVersion(t *testing.T) {
	out, err := exec.Command(binary, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "ztunnel ") {
		t.Fatalf("version: %q %v", out, err)
	}
}
