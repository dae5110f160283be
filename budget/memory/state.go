package memory

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/llmgate/llmgate/budget"
)

// The state file is a header line followed by a JSON body:
//
//	llmgate-budget-state 1 <body length> <SHA-256 of body, hex>\n
//	{"version":1,"windows":[...]}
//
// The length and checksum let a loader tell a complete file from a
// truncated or altered one.
const (
	fileMagic   = "llmgate-budget-state"
	fileVersion = 1
	// maxFileSize bounds what a loader reads into memory.
	maxFileSize = 1 << 30
)

// fileState is the persisted state.
type fileState struct {
	Version int          `json:"version"`
	Windows []fileWindow `json:"windows"`
}

// fileWindow is one tenant's spend, usage and live holds in one period.
type fileWindow struct {
	Tenant string            `json:"tenant"`
	Window string            `json:"window"`
	Keep   time.Time         `json:"keep"`
	Spent  budget.Amount     `json:"spent"`
	Rows   []budget.UsageRow `json:"rows"`
	Holds  []fileHold        `json:"holds,omitempty"`
}

// fileHold is a live hold: after a crash it expires and is charged, as the
// holds of a dead replica are on Redis.
type fileHold struct {
	ID       string        `json:"id"`
	Amount   budget.Amount `json:"amount"`
	Charge   budget.Charge `json:"charge"`
	Remember time.Duration `json:"remember"`
	Expires  time.Time     `json:"expires"`
}

// encodeState renders st as a state file.
func encodeState(st *fileState) ([]byte, error) {
	body, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	var buf bytes.Buffer
	buf.Grow(len(body) + 128)
	fmt.Fprintf(&buf, "%s %d %d %s\n", fileMagic, fileVersion, len(body), hex.EncodeToString(sum[:]))
	buf.Write(body)
	return buf.Bytes(), nil
}

// decodeState parses and verifies a state file. Its errors describe what is
// wrong without quoting the file's contents at length.
func decodeState(data []byte) (*fileState, error) {
	if len(data) == 0 {
		return nil, errors.New("the file is empty")
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("the file is larger than %d bytes", maxFileSize)
	}
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 || nl > 256 {
		return nil, errors.New("no header line: not a budget state file, or truncated")
	}
	fields := bytes.Fields(data[:nl])
	if len(fields) != 4 || string(fields[0]) != fileMagic {
		return nil, errors.New("bad header line: not a budget state file")
	}
	if v, err := strconv.Atoi(string(fields[1])); err != nil || v != fileVersion {
		return nil, fmt.Errorf("unsupported format version %q (this build reads %d)", truncate(fields[1]), fileVersion)
	}
	n, err := strconv.Atoi(string(fields[2]))
	if err != nil || n < 0 {
		return nil, fmt.Errorf("bad body length %q in header", truncate(fields[2]))
	}
	body := data[nl+1:]
	if len(body) != n {
		return nil, fmt.Errorf("body is %d bytes, header says %d: truncated or appended to", len(body), n)
	}
	want, err := hex.DecodeString(string(fields[3]))
	if err != nil || len(want) != sha256.Size {
		return nil, errors.New("bad checksum in header")
	}
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], want) {
		return nil, errors.New("checksum mismatch: the contents were altered")
	}
	var st fileState
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("bad JSON body: %w", err)
	}
	if st.Version != fileVersion {
		return nil, fmt.Errorf("body version %d, header version %d", st.Version, fileVersion)
	}
	if err := st.validate(); err != nil {
		return nil, err
	}
	return &st, nil
}

// validate checks what the checksum cannot: that the state makes sense.
func (st *fileState) validate() error {
	seen := make(map[budget.Key]bool, len(st.Windows))
	for i, w := range st.Windows {
		if err := validName(w.Tenant); err != nil {
			return fmt.Errorf("window %d: tenant: %w", i, err)
		}
		if _, err := budget.ParseWindowID(w.Window); err != nil {
			return fmt.Errorf("window %d: %w", i, err)
		}
		k := budget.Key{Tenant: w.Tenant, WindowID: w.Window}
		if seen[k] {
			return fmt.Errorf("window %d: tenant %q window %s appears twice", i, w.Tenant, w.Window)
		}
		seen[k] = true
		if w.Spent.Tokens < 0 || w.Spent.MicroUSD < 0 {
			return fmt.Errorf("window %d: negative spend", i)
		}
		rows := make(map[rowKey]bool, len(w.Rows))
		for j, r := range w.Rows {
			if err := validName(r.Model); err != nil {
				return fmt.Errorf("window %d row %d: model: %w", i, j, err)
			}
			if r.Deployment != "" {
				if err := validName(r.Deployment); err != nil {
					return fmt.Errorf("window %d row %d: deployment: %w", i, j, err)
				}
			}
			if r.Requests < 0 || r.PromptTokens < 0 || r.CompletionTokens < 0 || r.CachedTokens < 0 || r.MicroUSD < 0 || r.Expired < 0 {
				return fmt.Errorf("window %d row %d: negative count", i, j)
			}
			if r.Expired > r.Requests {
				return fmt.Errorf("window %d row %d: %d expired requests of %d", i, j, r.Expired, r.Requests)
			}
			rk := rowKey{r.Model, r.Deployment}
			if rows[rk] {
				return fmt.Errorf("window %d row %d: model %q deployment %q appears twice", i, j, r.Model, r.Deployment)
			}
			rows[rk] = true
		}
		ids := make(map[string]bool, len(w.Holds))
		for j, h := range w.Holds {
			if h.ID == "" || len(h.ID) > budget.MaxNameLen || ids[h.ID] {
				return fmt.Errorf("window %d hold %d: empty, too long or repeated ID", i, j)
			}
			ids[h.ID] = true
			if h.Amount.Tokens < 0 || h.Amount.MicroUSD < 0 || h.Remember < 0 || h.Charge.Usage.PromptTokens < 0 || h.Charge.Usage.CompletionTokens < 0 {
				return fmt.Errorf("window %d hold %d: negative amount", i, j)
			}
			if err := validName(h.Charge.Model); err != nil {
				return fmt.Errorf("window %d hold %d: model: %w", i, j, err)
			}
		}
	}
	return nil
}

func validName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > budget.MaxNameLen:
		return fmt.Errorf("longer than %d bytes", budget.MaxNameLen)
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 20 {
		return string(b[:20]) + "..."
	}
	return string(b)
}
