package app

import (
	"runtime"
	"strings"
	"testing"
)

func TestHelpListsCommands(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runApp(t, nil, args...)
			if code != 0 || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			for _, cmd := range []string{"lock", "bench", "serve", "version", "help"} {
				if !strings.Contains(stdout, "\n  "+cmd+" ") {
					t.Errorf("help does not list %q:\n%s", cmd, stdout)
				}
			}
		})
	}
}

func TestNoArgumentsIsAUsageError(t *testing.T) {
	code, stdout, stderr := runApp(t, nil)
	if code != 2 || stdout != "" || !strings.Contains(stderr, "Commands:") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestUnknownCommand(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"-x"}, {"help", "frobnicate"}, {"bench", "frobnicate"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runApp(t, nil, args...)
			line := oneLine(t, stderr)
			if code != 2 || stdout != "" || !strings.Contains(line, "unknown") || !strings.Contains(line, "help") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := runApp(t, nil, args...)
		line := oneLine(t, stdout)
		if code != 0 || stderr != "" || !strings.HasPrefix(line, "llmgate ") || !strings.Contains(line, runtime.Version()) {
			t.Fatalf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if code, _, stderr := runApp(t, nil, "version", "extra"); code != 2 {
		t.Fatalf("version extra: exit %d, stderr %q", code, stderr)
	}
}

// TestServeRefusesOpenPublicListen: without tenants the gateway is open, so
// it must not listen on every interface.
func TestServeRefusesOpenPublicListen(t *testing.T) {
	code, stdout, stderr := runApp(t, nil, "serve", "--listen", ":8080")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "listen") || !strings.Contains(stderr, "tenants") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

func TestBenchUsage(t *testing.T) {
	code, _, stderr := runApp(t, nil, "bench")
	if code != 2 || !strings.Contains(stderr, "llmgate bench lock") {
		t.Fatalf("bench: exit %d, stderr %q", code, stderr)
	}
	code, stdout, _ := runApp(t, nil, "help", "bench")
	if code != 0 || !strings.Contains(stdout, "llmgate bench lock") {
		t.Fatalf("help bench: exit %d, stdout %q", code, stdout)
	}
}

func TestLockHelp(t *testing.T) {
	for _, args := range [][]string{{"lock", "--help"}, {"lock", "-h"}, {"help", "lock"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runApp(t, nil, args...)
			if code != 0 || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			for _, want := range []string{
				"llmgate lock --store URL --key NAME", "--ttl", "--wait", "--fair", "--grace",
				"LLMGATE_STORE", "LLMGATE_LOCK_FENCE", "LLMGATE_LOCK_TOKEN", "LLMGATE_LOCK_KEY",
				"Exit status", "75", "Examples:", "* * * *",
			} {
				if !strings.Contains(stdout, want) {
					t.Errorf("lock help lacks %q", want)
				}
			}
		})
	}
}

func TestTwoDashes(t *testing.T) {
	for in, want := range map[string]string{
		`invalid value "x" for flag -ttl: want a duration`: `invalid value "x" for flag --ttl: want a duration`,
		"flag provided but not defined: -nope":             "flag provided but not defined: --nope",
		"flag needs an argument: -key":                     "flag needs an argument: --key",
		`invalid boolean value "x" for -fair: parse error`: `invalid boolean value "x" for --fair: parse error`,
		"bad flag syntax: ---x":                            "bad flag syntax: ---x",
	} {
		if got := twoDashes(in); got != want {
			t.Errorf("twoDashes(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactSecret(t *testing.T) {
	for _, tc := range []struct{ msg, store string }{
		{"cannot connect to redis://:s3cret@h:1", "redis://:s3cret@h:1"},
		{"user:s3cret in here", "redis://user:s3cret@h:1"},
		{"escaped s3%2Fcret", "redis://:s3%2Fcret@h:1"},
		{"bad s3cret@[::1", "redis://:s3cret@[::1"},
	} {
		if got := redactSecret(tc.msg, tc.store); strings.Contains(got, "s3") {
			t.Errorf("redactSecret(%q, %q) = %q", tc.msg, tc.store, got)
		}
	}
	if got := redactSecret("plain message", "redis://h:1"); got != "plain message" {
		t.Errorf("redactSecret changed a message without secrets: %q", got)
	}
}
