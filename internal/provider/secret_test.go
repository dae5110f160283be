package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
)

// echoTransport fails with an error that quotes the request's
// Authorization header, as a careless proxy or middleware might.
type echoTransport struct{}

func (echoTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("proxy refused %s with %q", r.URL, r.Header.Get("Authorization"))
}

// TestKeyNeverShown drives every error path with debug logging on and
// checks that the key appears in no error and no log line.
func TestKeyNeverShown(t *testing.T) {
	logs := testutil.NewBuffer()
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var shown []string
	show := func(err error) {
		if err == nil {
			t.Fatal("want an error")
		}
		shown = append(shown, err.Error(), fmt.Sprintf("%+v %#v", err, err))
	}

	// Retries (logged), then success.
	u := newUpstream(t, nil, reply(429, errBody("requests", "rate_limit_exceeded"), "retry-after-ms", "1"), reply(503, ""), answerOK)
	c := newClient(t, Config{Logger: logger, BreakerFailures: 2})
	resp, _, err := c.Do(t.Context(), targetOf(u), chatReq)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)

	// Connection refused until the breaker opens, then fail-fast.
	down := &Target{Name: "down", BaseURL: refusedURL(t), APIKey: testKey}
	for range 3 {
		_, _, err := c.Do(t.Context(), down, chatReq)
		show(err)
	}
	if c.State("down") != "open" {
		t.Fatalf("breaker %s, want open", c.State("down"))
	}

	// Time-to-headers timeout.
	arrived, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	hung := newUpstream(t, nil, hold(arrived, release, answerOK))
	tc := newClient(t, Config{Logger: logger, MaxAttempts: 1, TimeoutFloor: 20 * time.Millisecond, TimeoutCeiling: 20 * time.Millisecond})
	_, _, err = tc.Do(t.Context(), targetOf(hung), chatReq)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err %v, want ErrTimeout", err)
	}
	show(err)

	// A transport whose error quotes the key.
	ec := newClient(t, Config{Logger: logger, Transport: echoTransport{}, MaxAttempts: 2})
	_, _, err = ec.Do(t.Context(), &Target{Name: "echo", BaseURL: "https://api.example/v1", APIKey: testKey}, chatReq)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "[redacted]") {
		t.Fatalf("err %v, want ErrUnreachable with the key redacted", err)
	}
	show(err)

	// Bad base URLs carrying secrets in their userinfo or query.
	for _, base := range []string{"http://user:" + testKey + "@[::1", "ftp://user:" + testKey + "@host/v1?key=" + testKey, "http://h/%zz?key=" + testKey} {
		_, _, err := c.Do(t.Context(), &Target{Name: "bad", BaseURL: base, APIKey: testKey}, chatReq)
		if !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("%v, want ErrInvalidRequest", err)
		}
		show(err)
	}

	// A target printed or logged in any way.
	tg := Target{Name: "openai#1/gpt-4.1", BaseURL: "https://user:" + testKey + "@api.example/v1?key=" + testKey, APIKey: testKey,
		Header: http.Header{"Api-Key": {testKey}}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d"} {
		shown = append(shown, fmt.Sprintf(verb, tg), fmt.Sprintf(verb, &tg))
	}
	j, err := json.Marshal(tg)
	if err != nil {
		t.Fatal(err)
	}
	shown = append(shown, string(j))
	logger.Info("target", "target", tg, "ptr", &tg)

	if !strings.Contains(logs.String(), "provider: retrying") || !strings.Contains(logs.String(), "circuit breaker opened") {
		t.Fatalf("the logs lack the retries or the breaker change:\n%s", logs.String())
	}
	shown = append(shown, logs.String())
	for _, s := range shown {
		if strings.Contains(s, testKey) || strings.Contains(s, testKey[len(testKey)-12:]) {
			t.Fatalf("the key shows in: %s", s)
		}
	}
	if !strings.Contains(fmt.Sprint(tg), "openai#1/gpt-4.1") {
		t.Fatalf("%v: a printed target should still show its name", tg)
	}
}
