package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSimList: --list names every built-in with its description.
func TestSimList(t *testing.T) {
	code, out, errOut := runApp(t, nil, "sim", "--list")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, name := range []string{"burst", "duplicates", "conversations", "models", "outage", "budget"} {
		if !strings.Contains(out, name+" ") {
			t.Errorf("--list lacks %s:\n%s", name, out)
		}
	}
}

// TestSimShow: --show prints a scenario a user can copy and run as a file.
func TestSimShow(t *testing.T) {
	code, out, errOut := runApp(t, nil, "sim", "--show", "burst")
	if code != exitOK || !strings.Contains(out, "name: burst") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	path := filepath.Join(t.TempDir(), "my.yaml")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadScenario(path); err != nil {
		t.Errorf("the shown scenario does not load as a file: %v", err)
	}
}

// TestSimUsageErrors: bad arguments and files exit 2 with a message that
// says what to do.
func TestSimUsageErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: bad\nclients: {callers: 1}\ntypo: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "nope"}, "the built-ins are burst"},
		{[]string{"sim", "--show", "nope"}, "the built-ins are burst"},
		{[]string{"sim", bad}, "field typo not found"},
		{[]string{"sim", filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"sim", "burst", "--replicas", "99"}, "--replicas is 99"},
		{[]string{"sim", "burst", "--duration", "5m"}, "--duration is 5m0s"},
		{[]string{"sim", "burst", "duplicates"}, "one scenario"},
		{[]string{"sim", "--bogus"}, "--bogus"},
	} {
		code, _, errOut := runApp(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestSimHelp: the command is in the top-level help and has its own.
func TestSimHelp(t *testing.T) {
	_, out, _ := runApp(t, nil, "help")
	if !strings.Contains(out, "  sim ") {
		t.Errorf("llmgate help does not list sim:\n%s", out)
	}
	code, out, _ := runApp(t, nil, "sim", "--help")
	if code != exitOK || !strings.Contains(out, "llmgate sim [SCENARIO|FILE]") {
		t.Errorf("sim --help: exit %d:\n%s", code, out)
	}
}
