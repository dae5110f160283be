package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// providerBlock is a valid providers section most cases build on.
const providerBlock = `
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_env: OPENAI_API_KEY
    models: [gpt-4o, gpt-4o-mini]
`

// env returns a getenv over m.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// mustParse parses yaml that must be valid.
func mustParse(t *testing.T, yaml string, getenv func(string) string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(yaml), getenv)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// problems returns the problems in err, one per line of its message (the
// form errors.Join gives), without Parse's heading.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	var ie *invalidError
	if errors.As(err, &ie) {
		err = ie.err
	}
	return strings.Split(err.Error(), "\n")
}

// sameProblems fails unless got holds exactly the messages in want, in any
// order.
func sameProblems(t *testing.T, got, want []string) {
	t.Helper()
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		t.Errorf("problems:\n  got  %s\n  want %s", strings.Join(g, "\n       "), strings.Join(w, "\n       "))
	}
}

// noSecret fails if s contains any of secrets.
func noSecret(t *testing.T, what, s string, secrets ...string) {
	t.Helper()
	for _, k := range secrets {
		if k != "" && strings.Contains(s, k) {
			t.Errorf("%s shows the secret %q:\n%s", what, k, s)
		}
	}
}

func isInvalid(err error) bool { return errors.Is(err, ErrInvalid) }
