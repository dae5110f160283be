// Package tenants is the registry of tenants and API keys changed at run
// time (through the admin API) and shared by every replica through the
// store: versioned records, a memory and a Redis store, and a watcher that
// hands each new version to the gateway.
package tenants

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Errors of the registry.
var (
	ErrNotFound = errors.New("tenants: no such tenant")
	ErrExists   = errors.New("tenants: the tenant exists")
	ErrKeyTaken = errors.New("tenants: the key belongs to a tenant already")
	ErrNoKey    = errors.New("tenants: no such key")
	// ErrConflict means the record changed since it was read; Registry
	// retries on it.
	ErrConflict = errors.New("tenants: changed concurrently")
	ErrInvalid  = errors.New("tenants: invalid")
)

// Tenant is a tenant managed at run time, as stored and as the admin API
// shows it (keys only by their ID and hash).
type Tenant struct {
	Name        string            `json:"name"`
	Models      []string          `json:"models,omitempty"`
	Limits      Limits            `json:"limits"`
	ModelLimits map[string]Limits `json:"model_limits,omitempty"`
	Budget      *Budget           `json:"budget,omitempty"`
	Priority    string            `json:"priority,omitempty"`
	MaxWait     *Duration         `json:"max_wait,omitempty"`
	Cache       *Cache            `json:"cache,omitempty"`
	Dedup       bool              `json:"dedup,omitempty"`
	Keys        []Key             `json:"keys"`
	Created     time.Time         `json:"created"`
	Updated     time.Time         `json:"updated"`
}

// Limits is a quota; 0 means none of that kind.
type Limits struct {
	RPM         int64 `json:"rpm,omitempty"`
	TPM         int64 `json:"tpm,omitempty"`
	Concurrency int64 `json:"concurrency,omitempty"`
}

// Budget caps a tenant's spend per period (as the configuration's
// tenants[].budget).
type Budget struct {
	Period   string  `json:"period"`
	USD      float64 `json:"usd,omitempty"`
	Tokens   int64   `json:"tokens,omitempty"`
	Timezone string  `json:"timezone,omitempty"`
}

// Cache opts a tenant into the response cache.
type Cache struct {
	TTL    Duration `json:"ttl"`
	Models []string `json:"models,omitempty"`
}

// Key is one API key of a tenant, known by the SHA-256 of its text.
type Key struct {
	// ID names the key in the admin API: the first 12 hex digits of its
	// hash.
	ID      string    `json:"id"`
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
}

// Duration is a time.Duration written in JSON as Go writes durations
// ("1m30s").
type Duration time.Duration

// MarshalJSON writes d as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string such as "30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"30s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("want a duration such as \"30s\", not %q", s)
	}
	*d = Duration(v)
	return nil
}

// SetDefaults fills what a tenant leaves out, as the configuration file
// does: priority interactive, budget time zone UTC.
func (t *Tenant) SetDefaults() {
	if t.Priority == "" {
		t.Priority = "interactive"
	}
	if t.Budget != nil && t.Budget.Timezone == "" {
		t.Budget.Timezone = "UTC"
	}
}

// Snapshot is the registry at one version.
type Snapshot struct {
	Version int64
	Tenants []Tenant // by name
}

var (
	reName   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,99}$`)
	reSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidName reports whether name can name a tenant (as in the
// configuration file).
func ValidName(name string) bool { return reName.MatchString(name) }

// ValidHash reports whether h is a lowercase hex SHA-256.
func ValidHash(h string) bool { return reSHA256.MatchString(h) }

// HashKey is the lowercase hex SHA-256 of an API key.
func HashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// keyPrefix starts every key the registry makes, so that secret scanners
// and people recognise one.
const keyPrefix = "sk-llmgate-"

// NewKey returns a new random API key and its record.
func NewKey(now time.Time) (string, Key) {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	key := keyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return key, KeyOf(HashKey(key), now)
}

// KeyOf is the record of the key whose hash is sha.
func KeyOf(sha string, now time.Time) Key {
	return Key{ID: sha[:12], SHA256: sha, Created: now.UTC()}
}

// DecodeTenant reads a tenant from JSON, refusing unknown fields and
// trailing data.
func DecodeTenant(b []byte) (Tenant, error) {
	var t Tenant
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&t); err != nil {
		return Tenant{}, fmt.Errorf("%w: %s", ErrInvalid, jsonError(err))
	}
	if d.More() {
		return Tenant{}, fmt.Errorf("%w: data after the JSON object", ErrInvalid)
	}
	return t, nil
}

// jsonError is err in words a user of the admin API can act on (no Go
// type names).
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %s: wrong type (%s)", te.Field, te.Value)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// Store keeps the registry's records. Implementations: Memory and Redis;
// one conformance suite checks both.
type Store interface {
	// Version is the registry's version: it grows with every change.
	Version(ctx context.Context) (int64, error)
	// Load returns every record (tenant name -> JSON) and the version
	// they are at, read at one instant.
	Load(ctx context.Context) (int64, map[string][]byte, error)
	// Apply makes one change atomically and returns the new version.
	Apply(ctx context.Context, c Change) (int64, error)
}

// Change replaces one tenant's record.
type Change struct {
	Name string
	// Old is the record the change was made from; nil means the tenant
	// must not exist. ErrConflict when the stored one differs.
	Old []byte
	// New is the new record; nil deletes the tenant.
	New []byte
	// Add are key hashes that become the tenant's (ErrKeyTaken, naming
	// none, when one is another tenant's); Drop are hashes it gives up.
	Add, Drop []string
}

// Registry reads and changes tenants on a Store.
type Registry struct {
	store Store
	now   func() time.Time
}

// NewRegistry returns a registry on s; now is the clock of the records'
// times (nil: time.Now).
func NewRegistry(s Store, now func() time.Time) *Registry {
	if now == nil {
		now = time.Now
	}
	return &Registry{store: s, now: now}
}

// Store is the registry's store.
func (r *Registry) Store() Store { return r.store }

// Snapshot reads every tenant at one version.
func (r *Registry) Snapshot(ctx context.Context) (Snapshot, error) {
	v, recs, err := r.store.Load(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{Version: v, Tenants: make([]Tenant, 0, len(recs))}
	for _, name := range sortedKeys(recs) {
		var t Tenant
		if err := json.Unmarshal(recs[name], &t); err != nil {
			return Snapshot{}, fmt.Errorf("tenants: the record of %q is corrupt: %w", name, err)
		}
		s.Tenants = append(s.Tenants, t)
	}
	return s, nil
}

func sortedKeys(m map[string][]byte) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Get returns one tenant.
func (r *Registry) Get(ctx context.Context, name string) (Tenant, error) {
	t, _, err := r.get(ctx, name)
	return t, err
}

func (r *Registry) get(ctx context.Context, name string) (Tenant, []byte, error) {
	_, recs, err := r.store.Load(ctx)
	if err != nil {
		return Tenant{}, nil, err
	}
	rec, ok := recs[name]
	if !ok {
		return Tenant{}, nil, ErrNotFound
	}
	var t Tenant
	if err := json.Unmarshal(rec, &t); err != nil {
		return Tenant{}, nil, fmt.Errorf("tenants: the record of %q is corrupt: %w", name, err)
	}
	return t, rec, nil
}

// Create stores a new tenant with the keys it lists (ErrExists,
// ErrKeyTaken).
func (r *Registry) Create(ctx context.Context, t Tenant) (Tenant, int64, error) {
	now := r.now().UTC()
	t.Created, t.Updated = now, now
	if t.Keys == nil {
		t.Keys = []Key{}
	}
	rec, err := json.Marshal(t)
	if err != nil {
		return Tenant{}, 0, err
	}
	v, err := r.store.Apply(ctx, Change{Name: t.Name, New: rec, Add: hashes(t.Keys)})
	if errors.Is(err, ErrConflict) {
		err = ErrExists
	}
	return t, v, err
}

// maxRetries bounds Update's read-modify-write attempts under contention.
const maxRetries = 20

// Update changes a tenant with f (which must not change its name or keys
// unless it means to) and stores it; it retries f on a concurrent change.
func (r *Registry) Update(ctx context.Context, name string, f func(*Tenant) error) (Tenant, int64, error) {
	for range maxRetries {
		t, old, err := r.get(ctx, name)
		if err != nil {
			return Tenant{}, 0, err
		}
		before := hashes(t.Keys)
		if err := f(&t); err != nil {
			return Tenant{}, 0, err
		}
		t.Name = name
		t.Updated = r.now().UTC()
		after := hashes(t.Keys)
		rec, err := json.Marshal(t)
		if err != nil {
			return Tenant{}, 0, err
		}
		c := Change{Name: name, Old: old, New: rec}
		for _, h := range after {
			if !slices.Contains(before, h) {
				c.Add = append(c.Add, h)
			}
		}
		for _, h := range before {
			if !slices.Contains(after, h) {
				c.Drop = append(c.Drop, h)
			}
		}
		v, err := r.store.Apply(ctx, c)
		if errors.Is(err, ErrConflict) {
			continue
		}
		return t, v, err
	}
	return Tenant{}, 0, fmt.Errorf("%w: %d attempts", ErrConflict, maxRetries)
}

// Delete removes a tenant and its keys.
func (r *Registry) Delete(ctx context.Context, name string) (int64, error) {
	for range maxRetries {
		t, old, err := r.get(ctx, name)
		if err != nil {
			return 0, err
		}
		v, err := r.store.Apply(ctx, Change{Name: name, Old: old, Drop: hashes(t.Keys)})
		if errors.Is(err, ErrConflict) {
			continue
		}
		return v, err
	}
	return 0, fmt.Errorf("%w: %d attempts", ErrConflict, maxRetries)
}

func hashes(ks []Key) []string {
	out := make([]string, 0, len(ks))
	for _, k := range ks {
		out = append(out, k.SHA256)
	}
	return out
}
