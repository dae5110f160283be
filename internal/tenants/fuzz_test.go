package tenants

import (
	"encoding/json"
	"testing"
)

// FuzzDecode: the admin API's bodies never panic the decoder, and what it
// accepts survives a round trip.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"name":"t1","limits":{"rpm":3},"max_wait":"2s","cache":{"ttl":"1m","models":["a"]}}`,
		`{"name":"t","budget":{"period":"day","usd":1.5,"tokens":3,"timezone":"Europe/Paris"},"model_limits":{"m":{"tpm":1}}}`,
		`{"keys":[]}`, `[]`, `null`, `{"max_wait":5}`, `{"name":"x"} {}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, msg := decodeObject(b); msg == "" && m == nil {
			t.Fatal("decodeObject: no object and no reason")
		}
		tn, err := DecodeTenant(b)
		if err != nil {
			return
		}
		out, err := json.Marshal(tn)
		if err != nil {
			t.Fatalf("a decoded tenant does not encode: %v", err)
		}
		again, err := DecodeTenant(out)
		if err != nil {
			t.Fatalf("a decoded tenant does not decode again: %v\n%s", err, out)
		}
		out2, _ := json.Marshal(again)
		if string(out) != string(out2) {
			t.Fatalf("round trip changed the tenant:\n%s\n%s", out, out2)
		}
	})
}
