package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
)

// maxKeyFileBytes bounds an api_key_file: it holds one key.
const maxKeyFileBytes = 64 << 10

// Deployment is one (provider, key, model): the unit the gateway rate
// limits, breaks circuits on and labels metrics with. Its String, Format and
// LogValue never show the key or header values, and JSON omits them.
type Deployment struct {
	// Name is "<provider>/<model>" when the provider has one key (or none),
	// else "<provider>#<i>/<model>" with i from 1: the rate-limit scope
	// and metrics label.
	Name string
	// Provider is the provider, in the Config Deployments was called on.
	// Not in JSON: its literal header values may be secret.
	Provider *Provider `json:"-"`
	// Model is the model id as the provider names it.
	Model string
	// KeyIndex is the key's position among the provider's keys, from 0.
	KeyIndex int
	// KeyLabel says where the key comes from without showing it: the
	// environment variable's name, "file:<path>", or "none".
	KeyLabel string
	// APIKey is the key, sent as "Authorization: Bearer <key>"; empty for
	// a provider without one. Secret.
	APIKey string `json:"-"`
	// Limits are the effective limits: the provider's limits with the
	// model's model_limits applied.
	Limits Limits
	// Header holds the provider's extra headers, with ${NAME} references
	// resolved; nil if none. Values may be secret.
	Header http.Header `json:"-"`
}

// Target returns "<provider>/<model>", the form aliases and Targets use.
func (d Deployment) Target() string {
	if d.Provider == nil {
		return "/" + d.Model
	}
	return d.Provider.Name + "/" + d.Model
}

// String returns the deployment's name and key label, never the key.
func (d Deployment) String() string {
	return d.Name + " (key " + d.KeyLabel + ")"
}

// Format prints String for every verb, %#v and %d included, so that no
// formatting of a Deployment can reach its key.
func (d Deployment) Format(f fmt.State, _ rune) {
	_, _ = io.WriteString(f, d.String())
}

// LogValue logs the deployment's name, model and key label.
func (d Deployment) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", d.Name), slog.String("model", d.Model), slog.String("key", d.KeyLabel))
}

var (
	_ fmt.Formatter  = Deployment{}
	_ slog.LogValuer = Deployment{}
)

// keyRef is one configured key of a provider: where to read it.
type keyRef struct {
	path  string // YAML path of the setting, for messages
	label string // Deployment.KeyLabel
	env   string // variable name, or
	file  string // file path; neither for a provider without a key
}

// keyRefs lists the provider's keys in order; a provider without a key has
// one keyless entry, so that it still has one deployment per model.
func (p *Provider) keyRefs(i int) []keyRef {
	at := fmt.Sprintf("providers[%d]", i)
	switch {
	case p.APIKeyEnv != "":
		return []keyRef{{path: at + ".api_key_env", label: p.APIKeyEnv, env: p.APIKeyEnv}}
	case len(p.APIKeyEnvs) > 0:
		refs := make([]keyRef, len(p.APIKeyEnvs))
		for j, e := range p.APIKeyEnvs {
			refs[j] = keyRef{path: fmt.Sprintf("%s.api_key_envs[%d]", at, j), label: e, env: e}
		}
		return refs
	case p.APIKeyFile != "":
		return []keyRef{{path: at + ".api_key_file", label: "file:" + p.APIKeyFile, file: p.APIKeyFile}}
	}
	return []keyRef{{path: at, label: "none"}}
}

// resolve reads the key. Errors name the variable or file, never the value.
func (r keyRef) resolve(getenv func(string) string) (string, error) {
	switch {
	case r.env != "":
		key := strings.TrimSpace(getenv(r.env))
		if key == "" {
			return "", fmt.Errorf("%w: %s: $%s is not set or empty; export the provider's API key in it", ErrSecret, r.path, r.env)
		}
		if !cleanSecret(key) {
			return "", fmt.Errorf("%w: %s: $%s contains spaces or control characters; check its value", ErrSecret, r.path, r.env)
		}
		return key, nil
	case r.file != "":
		key, err := readKeyFile(r.file)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %w", ErrSecret, r.path, err)
		}
		return key, nil
	}
	return "", nil
}

// readKeyFile returns the one key a file holds, trimmed.
func readKeyFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err // *PathError: the path and the reason, no content
	}
	defer f.Close()
	// A device or a named pipe could block or never end.
	if fi, err := f.Stat(); err != nil {
		return "", err
	} else if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file; it should hold only the key", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxKeyFileBytes {
		return "", fmt.Errorf("%s is larger than %v; it should hold only the key", path, Size(maxKeyFileBytes))
	}
	key := strings.TrimSpace(string(data))
	switch {
	case key == "":
		return "", fmt.Errorf("%s is empty; write the provider's API key in it", path)
	case !cleanSecret(key):
		return "", fmt.Errorf("%s holds more than one key (spaces, line breaks or control characters inside); it should hold only the key", path)
	}
	return key, nil
}

// Deployments resolves every provider key (environment or file) and
// returns all deployments in configuration order: by provider, then key,
// then model. Call it on a valid Config. Errors (all of them, joined) match
// ErrSecret, or ErrInvalid for two keys of a provider that are the same.
func (c *Config) Deployments(getenv func(string) string) ([]Deployment, error) {
	return c.deployments(orNoEnv(getenv), true)
}

// deployments lists the deployments; with resolve false it reads no secret
// (for Explain) and leaves APIKey and Header empty.
func (c *Config) deployments(getenv func(string) string, resolve bool) ([]Deployment, error) {
	var out []Deployment
	var errs []error
	for i := range c.Providers {
		p := &c.Providers[i]
		refs := p.keyRefs(i)
		keys := make([]string, len(refs))
		var header http.Header
		if resolve {
			seen := map[string]int{}
			for j, r := range refs {
				key, err := r.resolve(getenv)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				if k, dup := seen[key]; dup && key != "" {
					// Two deployments on one key would each believe they
					// have the key's whole quota.
					errs = append(errs, &FieldError{Path: r.path, Msg: fmt.Sprintf("holds the same key as %s; every key must be different", refs[k].label)})
				}
				seen[key] = j
				keys[j] = key
			}
			h, err := p.resolveHeaders(i, getenv)
			if err != nil {
				errs = append(errs, err)
			}
			header = h
		}
		for j, r := range refs {
			for _, m := range p.Models {
				name := p.Name + "/" + m
				if len(refs) > 1 {
					name = fmt.Sprintf("%s#%d/%s", p.Name, j+1, m)
				}
				out = append(out, Deployment{
					Name:     name,
					Provider: p,
					Model:    m,
					KeyIndex: j,
					KeyLabel: r.label,
					APIKey:   keys[j],
					Limits:   p.Limits.Override(p.ModelLimits[m]),
					Header:   header.Clone(),
				})
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// resolveHeaders returns the provider's extra headers with ${NAME}
// references replaced; nil if it has none.
func (p *Provider) resolveHeaders(i int, getenv func(string) string) (http.Header, error) {
	if len(p.Headers) == 0 {
		return nil, nil
	}
	h := make(http.Header, len(p.Headers))
	var errs []error
	for name, val := range p.Headers {
		path := fmt.Sprintf("providers[%d].headers.%s", i, name)
		out, err := expandRefs(val, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %w", ErrSecret, path, err))
			continue
		}
		if strings.ContainsAny(out, "\r\n\x00") {
			errs = append(errs, fmt.Errorf("%w: %s: the value, once resolved, contains a line break or NUL; check the variables it refers to", ErrSecret, path))
			continue
		}
		h.Set(name, out)
	}
	return h, errors.Join(errs...)
}

// headerRefs returns the names referenced as ${NAME} in v. Any other "$" is
// kept as it is; a "${" that does not open a reference is an error, since it
// is almost certainly a typo.
func headerRefs(v string) ([]string, error) {
	var names []string
	for rest := v; ; {
		i := strings.Index(rest, "${")
		if i < 0 {
			return names, nil
		}
		rest = rest[i+2:]
		j := strings.IndexByte(rest, '}')
		if j < 0 || !reEnvName.MatchString(rest[:j]) {
			return nil, errors.New(`"${" must open a reference to an environment variable, like ${ORG_ID}`)
		}
		names = append(names, rest[:j])
		rest = rest[j+1:]
	}
}

// expandRefs replaces each ${NAME} in v by the variable's value; a
// variable that is not set is an error, not an empty string.
func expandRefs(v string, getenv func(string) string) (string, error) {
	names, err := headerRefs(v)
	if err != nil {
		return "", err
	}
	var missing []string
	for _, n := range names {
		if getenv(n) == "" && !slices.Contains(missing, "$"+n) {
			missing = append(missing, "$"+n)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("%s not set; export %s", strings.Join(missing, ", "), map[bool]string{true: "it", false: "them"}[len(missing) == 1])
	}
	var b strings.Builder
	for rest := v; ; {
		i := strings.Index(rest, "${")
		if i < 0 {
			b.WriteString(rest)
			return b.String(), nil
		}
		b.WriteString(rest[:i])
		rest = rest[i+2:]
		j := strings.IndexByte(rest, '}') // present: headerRefs checked
		b.WriteString(getenv(rest[:j]))
		rest = rest[j+1:]
	}
}

// Targets returns, for a model name a client sends, the ordered
// "provider/model" targets to try: an alias gives its targets; a model
// served by providers gives "p/model" for each, in configuration order; a
// "provider/model" string addresses that provider directly. ok is false
// for a name that is none of these. The slice is the caller's.
func (c *Config) Targets(model string) (targets []string, ok bool) {
	for _, a := range c.Models {
		if a.Name == model {
			return slices.Clone(a.Targets), len(a.Targets) > 0
		}
	}
	for _, p := range c.Providers {
		if slices.Contains(p.Models, model) {
			targets = append(targets, p.Name+"/"+model)
		}
	}
	if len(targets) > 0 {
		return targets, true
	}
	if prov, m, found := strings.Cut(model, "/"); found {
		if i := c.providerIndex(prov); i >= 0 && slices.Contains(c.Providers[i].Models, m) {
			return []string{model}, true
		}
	}
	return nil, false
}

// Router returns Targets as a lookup in a table built now, for every model
// name Targets knows: the gateway routes each request, and Targets builds
// its answer anew each time. The slices it returns are shared: callers must
// not modify them. c must not change afterwards.
func (c *Config) Router() func(model string) ([]string, bool) {
	table := make(map[string][]string)
	add := func(name string) {
		if _, done := table[name]; done {
			return
		}
		if targets, ok := c.Targets(name); ok {
			table[name] = targets
		}
	}
	for _, a := range c.Models {
		add(a.Name)
	}
	for _, p := range c.Providers {
		for _, m := range p.Models {
			add(m)
			add(p.Name + "/" + m)
		}
	}
	return func(model string) ([]string, bool) {
		if targets, ok := table[model]; ok {
			return targets, true
		}
		return nil, false // Targets knows no other name
	}
}

// HashKey returns the lowercase hex SHA-256 of a bearer token: what
// api_key_sha256 holds and what TenantKeys is keyed by.
func HashKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TenantKeys returns every tenant by the SHA-256 (lowercase hex, see
// HashKey) of its bearer token, read from the environment (trimmed) or
// taken from api_key_sha256. The pointers are into c.Tenants. Errors (all
// of them, joined) match ErrSecret for a variable that is not set and
// ErrInvalid for two tenants with one key; they never show a key.
func (c *Config) TenantKeys(getenv func(string) string) (map[string]*Tenant, error) {
	getenv = orNoEnv(getenv)
	out := make(map[string]*Tenant, len(c.Tenants))
	var errs []error
	for i := range c.Tenants {
		t := &c.Tenants[i]
		var h, path string
		switch {
		case t.APIKeyEnv != "":
			path = fmt.Sprintf("tenants[%d].api_key_env", i)
			key := strings.TrimSpace(getenv(t.APIKeyEnv))
			if key == "" {
				errs = append(errs, fmt.Errorf("%w: %s: $%s is not set or empty; export tenant %s's key in it, or use api_key_sha256", ErrSecret, path, t.APIKeyEnv, t.Name))
				continue
			}
			h = HashKey(key)
		case t.APIKeySHA256 != "":
			path = fmt.Sprintf("tenants[%d].api_key_sha256", i)
			h = strings.ToLower(t.APIKeySHA256)
		default:
			errs = append(errs, &FieldError{Path: fmt.Sprintf("tenants[%d]", i), Msg: "no key: set api_key_env or api_key_sha256"})
			continue
		}
		if prev, dup := out[h]; dup {
			errs = append(errs, &FieldError{Path: path, Msg: fmt.Sprintf("the same key as tenant %s; every tenant needs its own key", prev.Name)})
			continue
		}
		out[h] = t
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
