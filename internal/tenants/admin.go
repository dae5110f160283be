package tenants

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/openai"
)

// maxBody bounds an admin request's body.
const maxBody = 1 << 20

// Admin serves the admin API's tenant routes (/admin/tenants...) on a
// registry. The caller checks the admin token first.
type Admin struct {
	Registry *Registry
	// Check validates a tenant as the gateway would run it; its error's
	// text is shown to the admin.
	Check func(Tenant) error
	// FileTenant reports whether the configuration file defines a tenant
	// of that name (not changeable here); FileKey whether a key hash is
	// reserved (a file tenant's key, the admin token). Nil: none.
	FileTenant func(name string) bool
	FileKey    func(sha string) bool
	// Changed is called after each change (the replica then reloads at
	// once rather than at its next poll).
	Changed func()
	Log     *slog.Logger
	// Timeout bounds the store calls of one admin request. Default 5s.
	Timeout time.Duration
}

// Handler returns the routes.
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/tenants", a.list)
	mux.HandleFunc("POST /admin/tenants", a.create)
	mux.HandleFunc("GET /admin/tenants/{name}", a.get)
	mux.HandleFunc("PATCH /admin/tenants/{name}", a.patch)
	mux.HandleFunc("DELETE /admin/tenants/{name}", a.delete)
	mux.HandleFunc("GET /admin/tenants/{name}/keys", a.listKeys)
	mux.HandleFunc("POST /admin/tenants/{name}/keys", a.addKey)
	mux.HandleFunc("DELETE /admin/tenants/{name}/keys/{id}", a.revokeKey)
	mux.HandleFunc("/admin/tenants/", notFound)
	return mux
}

func notFound(w http.ResponseWriter, r *http.Request) {
	openai.Errorf(http.StatusNotFound, openai.TypeInvalidRequest, "unknown_url", "",
		"Unknown admin URL or method: %s %s. See docs/admin.md.", r.Method, r.URL.Path).Write(w)
}

// View is a tenant as the admin API shows it.
type View struct {
	Tenant
	Keys []KeyView `json:"keys"`
	// Source is "api" (this registry) or "file" (the configuration file;
	// only its name is shown).
	Source string `json:"source"`
}

// KeyView is a key as the admin API shows it: never the key, nor its
// hash.
type KeyView struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
}

func view(t Tenant) View {
	v := View{Tenant: t, Source: "api", Keys: make([]KeyView, 0, len(t.Keys))}
	for _, k := range t.Keys {
		v.Keys = append(v.Keys, KeyView{ID: k.ID, Created: k.Created})
	}
	return v
}

func (a *Admin) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	d := a.Timeout
	if d <= 0 {
		d = 5 * time.Second
	}
	return context.WithTimeout(r.Context(), d)
}

func (a *Admin) list(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	s, err := a.Registry.Snapshot(ctx)
	if err != nil {
		a.storeError(w, err)
		return
	}
	out := struct {
		Version int64  `json:"version"`
		Data    []View `json:"data"`
	}{Version: s.Version, Data: make([]View, 0, len(s.Tenants))}
	for _, t := range s.Tenants {
		out.Data = append(out.Data, view(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *Admin) get(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx, cancel := a.ctx(r)
	defer cancel()
	t, err := a.Registry.Get(ctx, name)
	if err != nil {
		a.fail(w, name, err)
		return
	}
	writeJSON(w, http.StatusOK, view(t))
}

// created is the answer to a POST that made a key: the key is shown this
// once.
type created struct {
	Tenant *View  `json:"tenant,omitempty"`
	KeyID  string `json:"key_id"`
	APIKey string `json:"api_key,omitempty"`
}

func (a *Admin) create(w http.ResponseWriter, r *http.Request) {
	fields, ok := readObject(w, r)
	if !ok {
		return
	}
	sha, ok := takeHash(w, fields, "api_key_sha256")
	if !ok {
		return
	}
	t, ok := decodeFields(w, fields)
	if !ok {
		return
	}
	if !ValidName(t.Name) {
		openai.BadRequest("name", "Invalid tenant name %q: 1 to 100 letters, digits, '.', '_', '@' or '-', starting with a letter or digit.", t.Name).Write(w)
		return
	}
	if a.FileTenant != nil && a.FileTenant(t.Name) {
		fileTenant(w, t.Name)
		return
	}
	t.SetDefaults()
	if !a.check(w, t) {
		return
	}
	now := a.Registry.now()
	var key string
	var k Key
	if sha != "" {
		k = KeyOf(sha, now)
	} else {
		key, k = NewKey(now)
	}
	if a.FileKey != nil && a.FileKey(k.SHA256) {
		keyTaken(w)
		return
	}
	t.Keys = []Key{k}
	ctx, cancel := a.ctx(r)
	defer cancel()
	t, v, err := a.Registry.Create(ctx, t)
	if err != nil {
		a.fail(w, t.Name, err)
		return
	}
	a.audit(r, "tenant.create", t.Name, v, "key_id", k.ID)
	vw := view(t)
	writeJSON(w, http.StatusCreated, created{Tenant: &vw, KeyID: k.ID, APIKey: key})
}

func (a *Admin) patch(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if a.FileTenant != nil && a.FileTenant(name) {
		fileTenant(w, name)
		return
	}
	fields, ok := readObject(w, r)
	if !ok {
		return
	}
	if n, ok := fields["name"]; ok {
		var s string
		if json.Unmarshal(n, &s) != nil || s != name {
			openai.BadRequest("name", "A tenant cannot be renamed: create a new one and move its keys.").Write(w)
			return
		}
	}
	// Each field given replaces the tenant's; null clears it.
	patch, ok := decodeFields(w, fields)
	if !ok {
		return
	}
	_ = patch // decoded only to report bad fields before the store is read
	var changed []string
	for f := range fields {
		changed = append(changed, f)
	}
	slices.Sort(changed)
	ctx, cancel := a.ctx(r)
	defer cancel()
	var invalid error
	t, v, err := a.Registry.Update(ctx, name, func(t *Tenant) error {
		cur, err := json.Marshal(t)
		if err != nil {
			return err
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(cur, &m); err != nil {
			return err
		}
		for f, raw := range fields {
			m[f] = raw
		}
		merged, err := json.Marshal(m)
		if err != nil {
			return err
		}
		nt, err := DecodeTenant(merged)
		if err != nil {
			invalid = err
			return err
		}
		nt.Keys, nt.Created = t.Keys, t.Created
		nt.SetDefaults()
		if a.Check != nil {
			if err := a.Check(nt); err != nil {
				invalid = err
				return err
			}
		}
		*t = nt
		return nil
	})
	if invalid != nil {
		openai.BadRequest("", "Invalid tenant: %s", strings.TrimPrefix(invalid.Error(), ErrInvalid.Error()+": ")).Write(w)
		return
	}
	if err != nil {
		a.fail(w, name, err)
		return
	}
	a.audit(r, "tenant.update", name, v, "fields", strings.Join(changed, ","))
	writeJSON(w, http.StatusOK, view(t))
}

func (a *Admin) delete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if a.FileTenant != nil && a.FileTenant(name) {
		fileTenant(w, name)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	v, err := a.Registry.Delete(ctx, name)
	if err != nil {
		a.fail(w, name, err)
		return
	}
	a.audit(r, "tenant.delete", name, v)
	writeJSON(w, http.StatusOK, map[string]any{"name": name, "deleted": true})
}

func (a *Admin) listKeys(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx, cancel := a.ctx(r)
	defer cancel()
	t, err := a.Registry.Get(ctx, name)
	if err != nil {
		a.fail(w, name, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"data": view(t).Keys})
}

// maxKeys bounds a tenant's keys (rotation needs two or three).
const maxKeys = 16

func (a *Admin) addKey(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if a.FileTenant != nil && a.FileTenant(name) {
		fileTenant(w, name)
		return
	}
	fields := map[string]json.RawMessage{}
	if r.ContentLength != 0 {
		var ok bool
		if fields, ok = readObject(w, r); !ok {
			return
		}
	}
	sha, ok := takeHash(w, fields, "sha256")
	if !ok {
		return
	}
	for f := range fields {
		openai.BadRequest(f, "Unknown field %q: a new key takes only sha256 (optional).", f).Write(w)
		return
	}
	now := a.Registry.now()
	var key string
	var k Key
	if sha != "" {
		k = KeyOf(sha, now)
	} else {
		key, k = NewKey(now)
	}
	if a.FileKey != nil && a.FileKey(k.SHA256) {
		keyTaken(w)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	errTooMany := errors.New("too many keys")
	_, v, err := a.Registry.Update(ctx, name, func(t *Tenant) error {
		if slices.ContainsFunc(t.Keys, func(o Key) bool { return o.ID == k.ID }) {
			return ErrKeyTaken
		}
		if len(t.Keys) >= maxKeys {
			return errTooMany
		}
		t.Keys = append(t.Keys, k)
		return nil
	})
	if errors.Is(err, errTooMany) {
		openai.BadRequest("", "Tenant %s has %d keys, the most it may have: revoke one first.", name, maxKeys).Write(w)
		return
	}
	if err != nil {
		a.fail(w, name, err)
		return
	}
	a.audit(r, "key.create", name, v, "key_id", k.ID)
	writeJSON(w, http.StatusCreated, created{KeyID: k.ID, APIKey: key})
}

func (a *Admin) revokeKey(w http.ResponseWriter, r *http.Request) {
	name, id := r.PathValue("name"), r.PathValue("id")
	if a.FileTenant != nil && a.FileTenant(name) {
		fileTenant(w, name)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	_, v, err := a.Registry.Update(ctx, name, func(t *Tenant) error {
		i := slices.IndexFunc(t.Keys, func(k Key) bool { return k.ID == id })
		if i < 0 {
			return ErrNoKey
		}
		t.Keys = slices.Delete(t.Keys, i, i+1)
		return nil
	})
	if err != nil {
		a.fail(w, name, err)
		return
	}
	a.audit(r, "key.revoke", name, v, "key_id", id)
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "deleted": true})
}

// check runs a.Check and answers 400 when t is refused.
func (a *Admin) check(w http.ResponseWriter, t Tenant) bool {
	if a.Check == nil {
		return true
	}
	if err := a.Check(t); err != nil {
		openai.BadRequest("", "Invalid tenant: %s", err).Write(w)
		return false
	}
	return true
}

// audit logs a change: who (the admin token's hash prefix), what, and the
// registry's version after it; never a key.
func (a *Admin) audit(r *http.Request, action, tenant string, version int64, attrs ...any) {
	if a.Changed != nil {
		a.Changed()
	}
	if a.Log == nil {
		return
	}
	args := append([]any{"admin", AdminID(r), "action", action, "tenant", tenant, "version", version}, attrs...)
	a.Log.Info("admin change", args...)
}

// AdminID names the admin who sent r in the audit log: the first 8 hex
// digits of the SHA-256 of their token.
func AdminID(r *http.Request) string {
	tok := ""
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		tok = strings.TrimSpace(h[7:])
	} else {
		tok = strings.TrimSpace(r.Header.Get("Api-Key"))
	}
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:4])
}

func (a *Admin) fail(w http.ResponseWriter, name string, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		openai.Errorf(http.StatusNotFound, openai.TypeNotFound, "unknown_tenant", "name", "No tenant is named %q in the registry.", name).Write(w)
	case errors.Is(err, ErrExists):
		openai.Errorf(http.StatusConflict, openai.TypeInvalidRequest, "tenant_exists", "name", "A tenant is named %q already: change it with PATCH.", name).Write(w)
	case errors.Is(err, ErrKeyTaken):
		keyTaken(w)
	case errors.Is(err, ErrNoKey):
		openai.Errorf(http.StatusNotFound, openai.TypeNotFound, "unknown_key", "id", "Tenant %s has no key with that id.", name).Write(w)
	case errors.Is(err, ErrConflict):
		openai.Errorf(http.StatusConflict, openai.TypeInvalidRequest, "conflict", "", "Tenant %s kept changing concurrently; retry.", name).Write(w)
	default:
		a.storeError(w, err)
	}
}

func (a *Admin) storeError(w http.ResponseWriter, err error) {
	if a.Log != nil {
		a.Log.Error("tenant registry: store call failed", "err", err)
	}
	openai.Errorf(http.StatusServiceUnavailable, openai.TypeUnavailable, "store_unavailable", "",
		"The tenant registry cannot be reached right now; retry.").Write(w)
}

func fileTenant(w http.ResponseWriter, name string) {
	openai.Errorf(http.StatusConflict, openai.TypeInvalidRequest, "tenant_in_config_file", "name",
		"Tenant %s is defined in the configuration file: change it there and send SIGHUP, or give the API's tenant another name.", name).Write(w)
}

func keyTaken(w http.ResponseWriter) {
	openai.Errorf(http.StatusConflict, openai.TypeInvalidRequest, "key_taken", "",
		"That key is in use already (by a tenant or as the admin token): every tenant needs keys of its own.").Write(w)
}

// readObject reads the body as one JSON object, field by field.
func readObject(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		openai.Errorf(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "body_too_large", "",
			"The body is larger than %d bytes or could not be read.", maxBody).Write(w)
		return nil, false
	}
	m, msg := decodeObject(b)
	if msg != "" {
		openai.BadRequest("", "%s", msg).Write(w)
		return nil, false
	}
	return m, true
}

// decodeObject parses one JSON object, or says why it cannot; keys,
// created and updated are not the client's to set.
func decodeObject(b []byte) (map[string]json.RawMessage, string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || m == nil {
		return nil, "The body must be a JSON object."
	}
	for _, f := range []string{"keys", "created", "updated"} {
		if _, ok := m[f]; ok {
			return nil, fmt.Sprintf("Field %q is not set by clients (keys: POST /admin/tenants/NAME/keys).", f)
		}
	}
	return m, ""
}

// takeHash removes the optional key hash field f from fields.
func takeHash(w http.ResponseWriter, fields map[string]json.RawMessage, f string) (string, bool) {
	raw, ok := fields[f]
	if !ok {
		return "", true
	}
	delete(fields, f)
	var s string
	if json.Unmarshal(raw, &s) != nil || !ValidHash(strings.ToLower(s)) {
		openai.BadRequest(f, `Want the 64 hexadecimal characters of the key's SHA-256, e.g. from: printf %%s "$KEY" | sha256sum`).Write(w)
		return "", false
	}
	return strings.ToLower(s), true
}

func decodeFields(w http.ResponseWriter, fields map[string]json.RawMessage) (Tenant, bool) {
	b, err := json.Marshal(fields)
	if err == nil {
		var t Tenant
		if t, err = DecodeTenant(b); err == nil {
			return t, true
		}
	}
	openai.BadRequest("", "Invalid tenant: %s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")).Write(w)
	return Tenant{}, false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.Errorf(http.StatusInternalServerError, openai.TypeServer, "internal_error", "", "The answer could not be encoded.").Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
