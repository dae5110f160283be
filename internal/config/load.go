package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llmgate/llmgate/budget"
)

// Load reads the YAML file at path, applies the environment overrides
// (getenv; nil means none), fills defaults and validates. Relative paths in
// the file (state_dir, api_key_file) are taken relative to the file's
// directory, so that the configuration means the same whatever the working
// directory.
func Load(path string, getenv func(string) string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	return parse(path, data, dir, getenv)
}

// Parse is Load on bytes; name is used in error messages and as Source.
// Relative paths stay relative to the working directory.
func Parse(name string, data []byte, getenv func(string) string) (*Config, error) {
	return parse(name, data, "", getenv)
}

func parse(name string, data []byte, dir string, getenv func(string) string) (*Config, error) {
	getenv = orNoEnv(getenv)
	if len(data) > MaxFileBytes {
		return nil, &syntaxError{name: name, lines: []string{fmt.Sprintf("larger than %v; a configuration is a few KiB", Size(MaxFileBytes))}}
	}
	// The durations whose zero means something (max_wait, the shutdown
	// delays) have their defaults in place before decoding: leaving the
	// key out keeps them, writing 0 replaces them.
	c := newConfig(name)
	if lines := decode(data, c); len(lines) > 0 {
		return nil, &syntaxError{name: name, lines: lines}
	}
	c.forgetWrittenLimits()
	if dir != "" {
		c.StateDir = underDir(dir, c.StateDir)
		for i := range c.Providers {
			c.Providers[i].APIKeyFile = underDir(dir, c.Providers[i].APIKeyFile)
		}
	}
	c.applyEnv(getenv)
	c.SetDefaults(getenv)
	if err := c.Validate(getenv); err != nil {
		return nil, &invalidError{name: name, err: err}
	}
	return c, nil
}

// forgetWrittenLimits drops the record of which limits the YAML wrote
// everywhere but in providers' model_limits, the one place it means
// something, so that limits compare equal to literals.
func (c *Config) forgetWrittenLimits() {
	for i := range c.Providers {
		c.Providers[i].Limits = c.Providers[i].Limits.plain()
	}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		t.Limits = t.Limits.plain()
		for m, l := range t.ModelLimits {
			t.ModelLimits[m] = l.plain()
		}
	}
}

// underDir resolves a relative path p against dir. "~" is left for
// Validate to refuse: it is a shell expansion, not part of a path.
func underDir(dir, p string) string {
	if p == "" || filepath.IsAbs(p) || strings.HasPrefix(p, "~") {
		return p
	}
	return filepath.Join(dir, p)
}

// decode reads data into c, strictly: unknown keys, repeated keys and
// values of the wrong type are all reported, one line each.
func decode(data []byte, c *Config) (lines []string) {
	// The YAML decoder is third-party code fed arbitrary bytes; a bug in it
	// must not take the gateway down.
	defer func() {
		if r := recover(); r != nil {
			lines = []string{fmt.Sprintf("the YAML parser failed (%v); check the file's syntax", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(c)
	if errors.Is(err, io.EOF) {
		return nil // an empty file: validation says what is missing
	}
	if err != nil {
		return explainYAML(err, data)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return explainYAML(err, data)
	}
	return []string{fmt.Sprintf("line %d: a second YAML document; put the whole configuration in one document (remove the ---)", extra.Line)}
}

// Patterns of the YAML decoder's messages, which name Go types.
var (
	reUnknownKey = regexp.MustCompile(`^line (\d+): field (.*) not found in type (\S+)$`)
	reRepeated   = regexp.MustCompile(`^line (\d+): field (.*) already set in type (\S+)$`)
	reWrongType  = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")
	reDupKey     = regexp.MustCompile(`^line (\d+): mapping key "(.*)" already defined at line (\d+)$`)
	reLine       = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
)

// explainYAML turns the decoder's error into messages in the file's terms:
// the setting's path and what it wants, instead of Go type names.
func explainYAML(err error, data []byte) []string {
	var raw []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		raw = te.Errors
	} else {
		raw = []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	idx := newIndex(data)
	out := make([]string, 0, len(raw))
	for _, m := range raw {
		out = append(out, idx.explain(m))
	}
	return out
}

func (x *index) explain(m string) string {
	if g := reUnknownKey.FindStringSubmatch(m); g != nil {
		line, _ := strconv.Atoi(g[1])
		keys := "known keys: " + strings.Join(yamlKeys[g[3]], ", ")
		if p, ok := x.keys[keyAt{line, g[2]}]; ok {
			return fmt.Sprintf("line %d: %s: unknown key; %s", line, p, keys)
		}
		return fmt.Sprintf("line %d: unknown key %s; %s", line, quote(g[2]), keys)
	}
	if g := reRepeated.FindStringSubmatch(m); g != nil {
		line, _ := strconv.Atoi(g[1])
		if p, ok := x.keys[keyAt{line, g[2]}]; ok {
			return fmt.Sprintf("line %d: %s: written twice; keep one", line, p)
		}
		return fmt.Sprintf("line %d: key %s written twice; keep one", line, quote(g[2]))
	}
	if g := reDupKey.FindStringSubmatch(m); g != nil {
		line, _ := strconv.Atoi(g[1])
		key := quote(g[2])
		if p, ok := x.keys[keyAt{line, g[2]}]; ok {
			key = p
		}
		return fmt.Sprintf("line %d: %s: written twice (first at line %s); keep one", line, key, g[3])
	}
	if g := reWrongType.FindStringSubmatch(m); g != nil {
		line, _ := strconv.Atoi(g[1])
		tag, goType := g[2], g[4]
		kind := yaml.ScalarNode
		switch tag {
		case "!!map":
			kind = yaml.MappingNode
		case "!!seq":
			kind = yaml.SequenceNode
		}
		v := x.value(line, kind)
		got := map[string]string{"!!map": "a mapping", "!!seq": "a list", "!!null": "nothing",
			"!!int": "a whole number", "!!float": "a number", "!!bool": "true or false"}[tag]
		// Show the value itself only where it cannot be a key pasted in the
		// wrong place.
		if kind == yaml.ScalarNode && v.path != "" && !mayHoldSecret(v.path) {
			got = quote(v.text)
		} else if got == "" {
			got = "text"
		}
		where := ""
		if v.path != "" {
			where = v.path + ": "
		}
		return fmt.Sprintf("line %d: %sgot %s, want %s", line, where, got, wantFor(goType))
	}
	if g := reLine.FindStringSubmatch(m); g != nil {
		// Messages from the UnmarshalYAML methods and syntax errors.
		line, _ := strconv.Atoi(g[1])
		if v := x.value(line, yaml.ScalarNode); v.path != "" && !strings.HasPrefix(g[2], v.path) {
			return fmt.Sprintf("line %d: %s: %s", line, v.path, g[2])
		}
		return fmt.Sprintf("line %d: %s", line, g[2])
	}
	return m
}

// mayHoldSecret reports whether a setting is one where a key could be
// written by mistake (api_key_env: sk-...), so its value is not shown.
func mayHoldSecret(path string) bool {
	p := strings.ToLower(path)
	return strings.Contains(p, "key") || strings.Contains(p, "token") || strings.Contains(p, "sha256") || strings.Contains(p, "headers")
}

// wantFor says, in the file's terms, what a Go type accepts.
func wantFor(goType string) string {
	switch goType {
	case "time.Duration":
		return "a duration such as 30s, 1m30s or 200ms"
	case "int", "int64", "uint64":
		return "a whole number"
	case "float64":
		return "a number"
	case "bool":
		return "true or false"
	case "string":
		return "a string"
	}
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping of name: value"
	case goType == "config.Config":
		return "a mapping of settings (listen:, providers:, ...); see docs/config.md"
	case strings.HasPrefix(goType, "config.") || strings.HasPrefix(goType, "*config.") || strings.HasPrefix(goType, "budget."):
		return "a mapping with keys " + strings.Join(yamlKeys[strings.TrimPrefix(goType, "*")], ", ")
	}
	return goType
}

// yamlKeys lists the keys of each type the file is decoded into, by the
// name the decoder's messages give it.
var yamlKeys = func() map[string][]string {
	m := map[string][]string{}
	for _, v := range []any{Config{}, Log{}, Upstream{}, Breaker{}, Timeout{}, Provider{}, SimulatedProvider{},
		Limits{}, Alias{}, Tenant{}, TenantBudget{}, BudgetStore{}, RateLimitStore{}, Sessions{}, Dedup{}, Cache{}, TenantCache{}, budget.Price{}, PassThrough{}} {
		t := reflect.TypeOf(v)
		var keys []string
		for i := range t.NumField() {
			k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if k != "" && k != "-" {
				keys = append(keys, k)
			}
		}
		m[t.String()] = keys
	}
	return m
}()

// index maps positions in the YAML source to the paths of the settings
// there ("providers[1].limits.rpm"), because the decoder's messages carry
// only line numbers.
type index struct {
	keys   map[keyAt]string
	values map[valueAt][]located
}

type keyAt struct {
	line int
	key  string
}

type valueAt struct {
	line int
	kind yaml.Kind
}

type located struct {
	path, text string
}

// maxIndexNodes bounds the work done indexing a hostile file.
const maxIndexNodes = 100_000

func newIndex(data []byte) *index {
	x := &index{keys: map[keyAt]string{}, values: map[valueAt][]located{}}
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil {
		return x // a syntax error: messages keep their line numbers only
	}
	budgetLeft := maxIndexNodes
	var walk func(n *yaml.Node, path string, depth int)
	walk = func(n *yaml.Node, path string, depth int) {
		budgetLeft--
		if budgetLeft < 0 || depth > 64 {
			return
		}
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path, depth+1)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				x.keys[keyAt{k.Line, k.Value}] = p
				x.note(v, p)
				walk(v, p, depth+1)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				x.note(c, p)
				walk(c, p, depth+1)
			}
		}
	}
	walk(&root, "", 0)
	return x
}

func (x *index) note(n *yaml.Node, path string) {
	at := valueAt{n.Line, n.Kind}
	x.values[at] = append(x.values[at], located{path: path, text: n.Value})
}

// value returns the one value of that kind on line; none if there are
// several (flow style), since the message could be about any of them.
func (x *index) value(line int, kind yaml.Kind) located {
	if v := x.values[valueAt{line, kind}]; len(v) == 1 {
		return v[0]
	}
	return located{}
}

// syntaxError is a file that could not be decoded.
type syntaxError struct {
	name  string
	lines []string
}

func (e *syntaxError) Error() string {
	if len(e.lines) == 1 {
		return fmt.Sprintf("config: cannot parse %s: %s", e.name, e.lines[0])
	}
	return fmt.Sprintf("config: cannot parse %s:\n  %s", e.name, strings.Join(e.lines, "\n  "))
}

func (e *syntaxError) Is(target error) bool { return target == ErrSyntax }

// invalidError is a file that decoded but did not validate.
type invalidError struct {
	name string
	err  error // from Validate
}

func (e *invalidError) Error() string {
	var n int
	if j, ok := e.err.(interface{ Unwrap() []error }); ok {
		n = len(j.Unwrap())
	}
	if n <= 1 {
		return fmt.Sprintf("config: %s: %v", e.name, e.err)
	}
	return fmt.Sprintf("config: %s: %d problems:\n  %s", e.name, n, strings.ReplaceAll(e.err.Error(), "\n", "\n  "))
}

func (e *invalidError) Unwrap() error { return e.err }

// durationString renders d compactly ("10m" rather than "10m0s").
func durationString(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
