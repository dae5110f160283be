package memory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/llmgate/llmgate/budget"
)

func sampleState() *fileState {
	return &fileState{Version: fileVersion, Windows: []fileWindow{{
		Tenant: "acme", Window: "2026-11", Keep: time.Date(2027, 12, 1, 0, 0, 0, 0, time.UTC),
		Spent: budget.Amount{Tokens: 150, MicroUSD: 210},
		Rows:  []budget.UsageRow{{Model: "gpt-4o", Deployment: "d", Requests: 2, PromptTokens: 100, CompletionTokens: 50, MicroUSD: 210}},
	}}}
}

func TestStateRoundTrip(t *testing.T) {
	data, err := encodeState(sampleState())
	if err != nil {
		t.Fatal(err)
	}
	st, err := decodeState(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := encodeState(st)
	if !bytes.Equal(data, again) {
		t.Fatalf("round trip changed the file:\n%s\n%s", data, again)
	}
}

// FuzzDecodeState feeds arbitrary bytes to the loader: it must never panic,
// and whatever it accepts must survive a round trip unchanged.
func FuzzDecodeState(f *testing.F) {
	good, err := encodeState(sampleState())
	if err != nil {
		f.Fatal(err)
	}
	empty, _ := encodeState(&fileState{Version: fileVersion})
	f.Add(good)
	f.Add(empty)
	f.Add(good[:len(good)/2])
	f.Add([]byte("llmgate-budget-state 1 2 " + string(bytes.Repeat([]byte("0"), 64)) + "\n{}"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeState(data)
		if err != nil {
			return
		}
		if err := st.validate(); err != nil {
			t.Fatalf("accepted an invalid state: %v", err)
		}
		enc, err := encodeState(st)
		if err != nil {
			t.Fatal(err)
		}
		st2, err := decodeState(enc)
		if err != nil {
			t.Fatalf("re-encoded state does not load: %v", err)
		}
		enc2, _ := encodeState(st2)
		if !bytes.Equal(enc, enc2) {
			t.Fatal("state changed across a round trip")
		}
	})
}

// FuzzDecodeStateBody fuzzes the JSON body behind a valid header and
// checksum, which random bytes would almost never reach.
func FuzzDecodeStateBody(f *testing.F) {
	good, _ := encodeState(sampleState())
	f.Add(good[bytes.IndexByte(good, '\n')+1:])
	f.Add([]byte(`{"version":1,"windows":[{"tenant":"","window":"2026-13","spent":{"tokens":-1}}]}`))
	f.Add([]byte(`{"version":1,"windows":[{"tenant":"a","window":"2026-11"},{"tenant":"a","window":"2026-11"}]}`))
	f.Add([]byte(`{"version":1,"windows":[{"tenant":"a","window":"2026-11","holds":[{"id":"r1","amount":{"tokens":5},"charge":{"Model":"m"},"remember":1,"expires":"2026-11-02T00:00:00Z"},{"id":"r1"}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var buf bytes.Buffer
		sum := sha256Hex(body)
		buf.WriteString(fileMagic + " 1 ")
		buf.WriteString(itoa(len(body)))
		buf.WriteString(" " + sum + "\n")
		buf.Write(body)
		got, err := decodeState(buf.Bytes())
		if err != nil {
			return
		}
		for _, w := range got.Windows {
			if w.Spent.Tokens < 0 || w.Spent.MicroUSD < 0 {
				t.Fatal("accepted negative spend")
			}
			if _, err := budget.ParseWindowID(w.Window); err != nil {
				t.Fatalf("accepted window %q", w.Window)
			}
			for _, h := range w.Holds {
				if h.ID == "" || h.Amount.Tokens < 0 || h.Amount.MicroUSD < 0 {
					t.Fatalf("accepted hold %+v", h)
				}
			}
		}
	})
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func itoa(n int) string { return strconv.Itoa(n) }
