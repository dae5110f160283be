package testutil

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
)

// BenchPing is the body of the Redis packages' BenchmarkPing, the unit
// their other benchmarks are read against: one PING round trip to a fresh
// redis-server on the same kind of client.
func BenchPing(b *testing.B) {
	c := StartRedis(b).Client(b)
	ctx := context.Background()
	for b.Loop() {
		if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
}

// JSONObject decodes what a bench command printed with --json: exactly
// one JSON object, which must have every one of fields.
func JSONObject(tb testing.TB, out string, fields ...string) map[string]any {
	tb.Helper()
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(&m); err != nil {
		tb.Fatalf("stdout is not one JSON object: %v\n%s", err, out)
	}
	if dec.More() {
		tb.Fatalf("stdout has more than one JSON value:\n%s", out)
	}
	for _, f := range fields {
		if _, ok := m[f]; !ok {
			tb.Errorf("JSON lacks %q: %s", f, out)
		}
	}
	return m
}
