package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fuzzEnv is the environment FuzzParse runs with: keys the fuzzer may refer
// to, and overrides.
var fuzzEnv = map[string]string{
	"OPENAI_API_KEY": "fuzz-secret-openai-7f3a",
	"K":              "fuzz-secret-k-19c2",
	"A":              "fuzz-secret-a-55d0",
	"ORG":            "fuzz-secret-org-e1b8",
}

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		providerBlock,
		providerBlock + "models: [{name: fast, targets: [openai/gpt-4o]}]\ntenants: [{name: a, api_key_env: A, models: [fast]}]",
		"providers: [{name: s, type: simulated, models: [m], limits: {<<: {rpm: 1}, tpm: 2}}]",
		"providers: [{name: a, base_url: 'https://a/v1', api_key_env: K, models: [m], headers: {X: '${ORG}'}, model_limits: {m: {rpm: 0}}}]",
		"max_body_bytes: 4MiB\nmax_wait: 0s",
		"a: &a [*a]",
		"listen: [\n",
		"\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	getenv := env(fuzzEnv)
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data, getenv)
		if err != nil {
			if c != nil {
				t.Fatal("a Config and an error")
			}
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is neither ErrSyntax nor ErrInvalid", err)
			}
			checkNoSecret(t, data, "error", err.Error())
			return
		}
		if err := c.Validate(getenv); err != nil {
			t.Fatalf("Parse accepted what Validate refuses: %v", err)
		}
		var out bytes.Buffer
		c.Explain(&out, getenv)
		checkNoSecret(t, data, "Explain", out.String())
		_ = c.Warnings()
		for _, a := range c.Models {
			if _, ok := c.Targets(a.Name); !ok {
				t.Fatalf("alias %q has no targets", a.Name)
			}
		}
		for _, tn := range c.Tenants {
			for _, m := range tn.Models {
				targets, ok := c.Targets(m)
				if !ok || len(targets) == 0 {
					t.Fatalf("tenant model %q has no targets", m)
				}
			}
		}
		if _, err := c.TenantKeys(getenv); err != nil {
			checkNoSecret(t, data, "TenantKeys error", err.Error())
		}
		for _, p := range c.Providers {
			if p.Type == TypeSimulated {
				if err := p.SimConfig().Validate(); err != nil {
					t.Fatalf("the simulator refuses provider %s: %v", p.Name, err)
				}
			}
		}
		for _, p := range c.Providers {
			if p.APIKeyFile != "" {
				return // the fuzzer must not read files of its choosing
			}
		}
		ds, err := c.Deployments(getenv)
		if err != nil {
			checkNoSecret(t, data, "Deployments error", err.Error())
			return
		}
		for _, d := range ds {
			checkNoSecret(t, data, "Deployment", d.String())
			if d.Provider == nil {
				t.Fatal("deployment without provider")
			}
		}
	})
}

// checkNoSecret fails if out shows an environment value that the input did
// not itself contain.
func checkNoSecret(t *testing.T, data []byte, what, out string) {
	t.Helper()
	for _, v := range fuzzEnv {
		if strings.Contains(out, v) && !bytes.Contains(data, []byte(v)) {
			t.Fatalf("%s shows the secret %q: %s", what, v, out)
		}
	}
}
