package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
)

// anonymous is the tenant of open access (no tenants configured).
var anonymous = &Tenant{Name: "anonymous"}

// authenticate returns the request's tenant, or a 401.
func (g *Gateway) authenticate(r *http.Request) (*Tenant, *apiError) {
	key, ok := bearer(r)
	tenants := g.tenants.Load().byKey
	if len(tenants) == 0 {
		return anonymous, nil
	}
	if !ok {
		return nil, errf(http.StatusUnauthorized, "authentication_error", "missing_api_key", "",
			"You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'.")
	}
	sum := sha256.Sum256([]byte(key))
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	t := tenants[string(hx[:])] // indexed in place: no string is made
	if t == nil {
		return nil, errf(http.StatusUnauthorized, "authentication_error", "invalid_api_key", "",
			"Incorrect API key provided. Ask your llmgate operator for a valid key.")
	}
	return t, nil
}

// bearer returns the token of an "Authorization: Bearer" header (also
// accepting OpenAI's "api-key" header used by Azure SDKs).
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		tok := strings.TrimSpace(h[7:])
		return tok, tok != ""
	}
	if k := strings.TrimSpace(r.Header.Get("Api-Key")); k != "" {
		return k, true
	}
	return "", false
}

// admin wraps an admin handler with the admin token check.
func (g *Gateway) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		setRequestID(w, r)
		if g.opt.AdminTokenSHA256 == "" {
			errf(http.StatusNotFound, "not_found_error", "admin_disabled", "",
				"The admin API is disabled: set the admin token (admin_token_env) to enable it.").Write(w)
			return
		}
		if !tokenMatches(r, g.opt.AdminTokenSHA256) {
			errf(http.StatusUnauthorized, "authentication_error", "invalid_admin_token", "",
				"The admin API needs the admin token as 'Authorization: Bearer TOKEN'.").Write(w)
			return
		}
		h(w, r)
	}
}

// tokenMatches reports whether r carries the bearer token whose hex
// SHA-256 is wantSHA256, compared in constant time.
func tokenMatches(r *http.Request, wantSHA256 string) bool {
	tok, _ := bearer(r)
	sum := sha256.Sum256([]byte(tok))
	want, err := hex.DecodeString(wantSHA256)
	return err == nil && tok != "" && subtle.ConstantTimeCompare(sum[:], want) == 1
}
