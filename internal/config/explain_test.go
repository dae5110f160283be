package config

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// fullEnv sets every variable testdata/full.yaml refers to.
var fullEnv = map[string]string{
	"OPENAI_KEY_A":       "sk-secret-a-0123456789",
	"OPENAI_KEY_B":       "sk-secret-b-0123456789",
	"BACKUP_API_KEY":     "sk-secret-backup-0123",
	"OPENAI_ORG_ID":      "org-secret-id",
	"ACME_KEY":           "acme-secret-0123456789",
	DefaultAdminTokenEnv: "admin-secret-0123456789abcdef",
}

// fullSecrets are values that must never be printed.
var fullSecrets = []string{"sk-secret-a", "sk-secret-b", "sk-secret-backup", "org-secret-id", "acme-secret", "admin-secret", "s3cret", "sk-local-test-key", "cache-secret"}

func TestExplainGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		env    map[string]string
	}{
		{"testdata/full.explain.golden", fullEnv},
		{"testdata/full-noenv.explain.golden", nil}, // check-config where the secrets are not
	} {
		t.Run(filepath.Base(tc.golden), func(t *testing.T) {
			c, err := Load("testdata/full.yaml", env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			c.Explain(&out, env(tc.env))
			noSecret(t, "Explain", out.String(), fullSecrets...)
			// The key file's absolute path depends on the checkout.
			abs, _ := filepath.Abs("testdata")
			got := strings.ReplaceAll(out.String(), abs, "$TESTDATA")
			if *update {
				if err := os.WriteFile(tc.golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(tc.golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("Explain output differs from %s (go test -update rewrites it):\n%s", tc.golden, got)
			}
		})
	}
}

func TestExplainContents(t *testing.T) {
	c, err := Load("testdata/full.yaml", env(fullEnv))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	c.Explain(&out, env(fullEnv))
	s := out.String()
	for _, want := range []string{
		"  store            redis://xxxxx@redis.internal:6379/0: shared by every replica\n",
		"  admin API        on (token in $LLMGATE_ADMIN_TOKEN)\n",
		"    keys: #1 $OPENAI_KEY_A (set), #2 $OPENAI_KEY_B (set)\n",
		"    openai#2/gpt-4o-mini             rpm 5000, tpm 4000000\n",
		"    backup/gpt-4o  rpm 5000, tpm 800000\n",
		"  smart -> openai/gpt-4o, backup/gpt-4o (alias)\n",
		"  gpt-4o -> openai/gpt-4o, backup/gpt-4o\n",
		"  acme: key in $ACME_KEY (set)\n",
		"    budget: $250 and 50000000 tokens per month, periods start at midnight Europe/Paris\n",
		"  nightly-batch: key by SHA-256 9f86d081884c...\n",
		"Warnings: none\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Explain lacks %q:\n%s", want, s)
		}
	}

	// Missing secrets and a weak admin token are warnings.
	out.Reset()
	weak := map[string]string{DefaultAdminTokenEnv: "wk7q"}
	c.Explain(&out, env(weak))
	s = out.String()
	for _, want := range []string{
		"  - providers[0].api_key_envs[0]: $OPENAI_KEY_A is not set: the gateway will not start until it is\n",
		"  - providers[0].headers.OpenAI-Organization: $OPENAI_ORG_ID is not set: the gateway will not start until it is\n",
		"  - tenants[0].api_key_env: $ACME_KEY is not set: the gateway will not start until it is\n",
		"  - admin_token_env: $LLMGATE_ADMIN_TOKEN is shorter than 16 characters; use a long random token, e.g. from: openssl rand -hex 32\n",
		"    keys: #1 $OPENAI_KEY_A (NOT SET), #2 $OPENAI_KEY_B (NOT SET)\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Explain lacks %q:\n%s", want, s)
		}
	}
	noSecret(t, "Explain", s, "wk7q")
}

func TestExplainDefaultAndOverrides(t *testing.T) {
	getenv := env(map[string]string{EnvMaxWait: "0", EnvStore: "redis://:pw-secret@localhost:6379"})
	c := Default(getenv)
	var out bytes.Buffer
	c.Explain(&out, getenv)
	s := out.String()
	for _, want := range []string{
		"Configuration: built-in default (no file, no OPENAI_API_KEY: the simulated provider)\n",
		"  max wait         0: no waiting, 429 at once (from LLMGATE_MAX_WAIT)\n",
		"  store            redis://xxxxx@localhost:6379 (from LLMGATE_STORE): shared by every replica\n",
		"  admin API        off ($LLMGATE_ADMIN_TOKEN is empty)\n",
		"  sim: simulated, in-process\n",
		"    sim/gpt-4.1                 no limits\n",
		"Tenants: none (open access: requests need no key)\n",
		"  - no tenants: anyone who can connect to 127.0.0.1:8080 uses the gateway without a key (allowed only on a loopback address)\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Explain lacks %q:\n%s", want, s)
		}
	}
	noSecret(t, "Explain", s, "pw-secret")
}

// TestExplainWriteError checks that Explain stops at the first failed write.
func TestExplainWriteError(t *testing.T) {
	w := &failingWriter{}
	Default(nil).Explain(w, nil)
	if w.calls != 1 {
		t.Errorf("%d writes after the first failed, want none", w.calls-1)
	}
}

type failingWriter struct{ calls int }

func (w *failingWriter) Write([]byte) (int, error) {
	w.calls++
	return 0, errors.New("broken pipe")
}
