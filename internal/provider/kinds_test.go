package provider

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestKinds: each dialect gets its key in its own header (and never the
// caller's), Anthropic an anthropic-version, Azure its deployment URL.
func TestKinds(t *testing.T) {
	type seen struct {
		url    string
		header http.Header
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.URL.String(), r.Header.Clone()}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	c := newClient(t, Config{})
	caller := http.Header{"Authorization": {"Bearer tenant"}, "X-Api-Key": {"tenant"}, "Api-Key": {"tenant"}}
	for _, tc := range []struct {
		target  Target
		path    string
		url     string
		key     string // the header that must carry "secret"
		version string // anthropic-version, if any
	}{
		{Target{Name: "o"}, "/chat/completions", "/v1/chat/completions", "Authorization", ""},
		{Target{Name: "a", Kind: KindAnthropic}, "/messages", "/v1/messages", "X-Api-Key", DefaultAnthropicVersion},
		{Target{Name: "a2", Kind: KindAnthropic, APIVersion: "2099-01-01"}, "/messages", "/v1/messages", "X-Api-Key", "2099-01-01"},
		{Target{Name: "z", Kind: KindAzure, APIVersion: "2024-10-21", AzureDeployment: "my gpt"}, "/chat/completions?x=1",
			"/v1/openai/deployments/my%20gpt/chat/completions?api-version=2024-10-21&x=1", "Api-Key", ""},
	} {
		tc.target.BaseURL, tc.target.APIKey = srv.URL+"/v1", "secret"
		resp, _, err := c.Do(t.Context(), &tc.target, Request{Path: tc.path, Body: []byte(`{}`), Header: caller.Clone()})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := <-got
		if s.url != tc.url {
			t.Errorf("%s: URL %s, want %s", tc.target.Name, s.url, tc.url)
		}
		want := "secret"
		if tc.key == "Authorization" {
			want = "Bearer secret"
		}
		for _, k := range keyHeaders {
			v := s.header.Get(k)
			switch {
			case k == tc.key && v != want:
				t.Errorf("%s: %s = %q, want %q", tc.target.Name, k, v, want)
			case k != tc.key && v != "":
				t.Errorf("%s: the caller's %s reached the provider: %q", tc.target.Name, k, v)
			}
		}
		if v := s.header.Get("Anthropic-Version"); v != tc.version {
			t.Errorf("%s: anthropic-version %q, want %q", tc.target.Name, v, tc.version)
		}
	}
}
