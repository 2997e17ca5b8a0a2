package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// TestConfigDumpGolden: the config_dump of a known local config matches the
// golden file, apart from the sections that carry run-time values (version,
// config paths, certificate times).
func TestConfigDumpGolden(t *testing.T) {
	p := startZtunnel(t, "LOCAL_XDS_PATH=../../examples/two-pods.yaml", "FAKE_CA=true", "XDS_ADDRESS=", "PROXY_MODE=shared")
	code, body := get(t, "http://"+p.addrs["admin"]+"/config_dump")
	if code != 200 {
		t.Fatalf("config_dump = %d", code)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"workloads", "services", "policies", "certificates", "workloadState", "version", "config"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("config_dump lacks the %q section", k)
		}
	}
	delete(doc, "version")
	delete(doc, "config")
	got, _ := json.MarshalIndent(doc, "", "  ")
	got = append(got, '\n')
	golden := filepath.Join("testdata", "config_dump.golden.json")
	if *update {
		os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run ConfigDumpGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("config_dump differs from %s (go test -update rewrites it); got:\n%s", golden, got)
	}
}
