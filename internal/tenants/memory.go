package tenants

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// Memory is the store of one process, optionally kept in a file so that a
// restart loses nothing.
type Memory struct {
	path string
	mu   sync.Mutex // protects what follows
	ver  int64
	recs map[string][]byte // tenant -> record
	keys map[string]string // key hash -> tenant
}

var _ Store = (*Memory)(nil)

// memoryFile is the file's content.
type memoryFile struct {
	Version int64                      `json:"version"`
	Tenants map[string]json.RawMessage `json:"tenants"`
}

// NewMemory returns an empty store kept in memory only.
func NewMemory() *Memory {
	return &Memory{recs: map[string][]byte{}, keys: map[string]string{}}
}

// OpenMemory returns a store kept in the file at path (created on the
// first change).
func OpenMemory(path string) (*Memory, error) {
	m := NewMemory()
	m.path = path
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	var f memoryFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("tenants: %s is corrupt: %w", path, err)
	}
	m.ver = f.Version
	for name, rec := range f.Tenants {
		var t Tenant
		if err := json.Unmarshal(rec, &t); err != nil {
			return nil, fmt.Errorf("tenants: %s: tenant %q is corrupt: %w", path, name, err)
		}
		m.recs[name] = rec
		for _, k := range t.Keys {
			m.keys[k.SHA256] = name
		}
	}
	return m, nil
}

// Version implements Store.
func (m *Memory) Version(context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ver, nil
}

// Load implements Store.
func (m *Memory) Load(context.Context) (int64, map[string][]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]byte, len(m.recs))
	for k, v := range m.recs {
		out[k] = v // records are never modified in place
	}
	return m.ver, out, nil
}

// Apply implements Store.
func (m *Memory) Apply(_ context.Context, c Change) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.recs[c.Name]
	if ok != (c.Old != nil) || !bytes.Equal(cur, c.Old) {
		return 0, ErrConflict
	}
	for _, h := range c.Add {
		if o, ok := m.keys[h]; ok && o != c.Name {
			return 0, ErrKeyTaken
		}
	}
	for _, h := range c.Drop {
		delete(m.keys, h)
	}
	for _, h := range c.Add {
		m.keys[h] = c.Name
	}
	if c.New == nil {
		delete(m.recs, c.Name)
	} else {
		m.recs[c.Name] = bytes.Clone(c.New)
	}
	m.ver++
	if err := m.saveLocked(); err != nil {
		return 0, err
	}
	return m.ver, nil
}

// saveLocked writes the file, if any, atomically (a new file renamed over
// the old one).
func (m *Memory) saveLocked() error {
	if m.path == "" {
		return nil
	}
	f := memoryFile{Version: m.ver, Tenants: make(map[string]json.RawMessage, len(m.recs))}
	for k, v := range m.recs {
		f.Tenants[k] = v
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(m.path), ".tenants-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), m.path)
}
