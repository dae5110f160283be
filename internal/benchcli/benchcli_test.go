package benchcli

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newTest returns a Command with one flag of each kind the bench commands
// use, a hidden one and a More section.
func newTest() (c *Command, stdout, stderr *bytes.Buffer) {
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	c = New("llmgate bench x", "usage: llmgate bench x [--n N]", "Measures x.", stdout, stderr)
	c.Flags.Int("n", 3, "how many `N`")
	c.Flags.Duration("wait", 0, "how long to wait")
	c.Flags.Duration("duration", time.Second, "how long to run")
	c.Flags.String("store", "", "store URL")
	c.Flags.Bool("child", false, "run as a worker")
	c.JSON()
	c.CPUProfile()
	c.Hidden = map[string]bool{"child": true}
	c.More = func(w io.Writer) { io.WriteString(w, "\nmore:\n  here\n") }
	return c, stdout, stderr
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		c, stdout, stderr := newTest()
		code, ok := c.Parse([]string{arg})
		if ok || code != ExitOK || stderr.Len() != 0 {
			t.Fatalf("%s: code %d, ok %v, stderr %q", arg, code, ok, stderr)
		}
		want := `usage: llmgate bench x [--n N]

Measures x.

flags:
  --cpuprofile file
    	write a CPU profile of this process to file
  --duration duration
    	how long to run (default 1s)
  --json
    	print one JSON object instead of a table
  --n N
    	how many N (default 3)
  --store string
    	store URL
  --wait duration
    	how long to wait

more:
  here
`
		if got := stdout.String(); got != want {
			t.Errorf("%s: help\n%s\nwant\n%s", arg, got, want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "llmgate bench x: flag provided but not defined: -bogus\n"},
		{[]string{"--n", "many"}, `llmgate bench x: invalid value "many" for flag -n: parse error` + "\n"},
		{[]string{"--n", "1", "extra"}, `llmgate bench x: unexpected argument "extra"` + "\n"},
	} {
		c, stdout, stderr := newTest()
		code, ok := c.Parse(tc.args)
		if ok || code != ExitUsage || stdout.Len() != 0 {
			t.Errorf("%v: code %d, ok %v, stdout %q", tc.args, code, ok, stdout)
		}
		want := tc.want + "usage: llmgate bench x [--n N]\nrun 'llmgate bench x --help' for all flags\n"
		if stderr.String() != want {
			t.Errorf("%v: stderr\n%q\nwant\n%q", tc.args, stderr, want)
		}
	}
}

func TestParseAndGiven(t *testing.T) {
	c, stdout, stderr := newTest()
	code, ok := c.Parse([]string{"--n", "5", "--json", "--child"})
	if !ok || code != ExitOK || stdout.Len()+stderr.Len() != 0 {
		t.Fatalf("code %d, ok %v, stdout %q, stderr %q", code, ok, stdout, stderr)
	}
	got := c.Given()
	if len(got) != 3 || !got["n"] || !got["json"] || !got["child"] {
		t.Errorf("Given() = %v, want n, json and child", got)
	}
	if n := c.Flags.Lookup("n").Value.String(); n != "5" {
		t.Errorf("--n = %s, want 5", n)
	}
}

func TestFail(t *testing.T) {
	c, stdout, stderr := newTest()
	if code := c.Fail(errors.New("no store")); code != ExitFail {
		t.Errorf("Fail = %d, want %d", code, ExitFail)
	}
	if stdout.Len() != 0 || stderr.String() != "llmgate bench x: no store\n" {
		t.Errorf("stdout %q, stderr %q", stdout, stderr)
	}
}

func TestStartCPUProfile(t *testing.T) {
	stop, err := StartCPUProfile("")
	if err != nil {
		t.Fatal(err)
	}
	stop()

	path := filepath.Join(t.TempDir(), "cpu.prof")
	stop, err = StartCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A second profile cannot start while one runs; the failed start must
	// not leave the first one broken.
	if _, err := StartCPUProfile(filepath.Join(t.TempDir(), "second.prof")); err == nil {
		t.Error("a second StartCPUProfile succeeded while one ran")
	}
	stop()
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Errorf("profile %s: %v, size %d", path, err, sizeOf(fi))
	}

	if _, err := StartCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir.prof")); err == nil || !strings.Contains(err.Error(), "dir.prof") {
		t.Errorf("StartCPUProfile in a missing directory: %v, want an error naming the file", err)
	}
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return -1
	}
	return fi.Size()
}
