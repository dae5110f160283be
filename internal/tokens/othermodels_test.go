package tokens

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// TestOtherModelsApproximation measures how far Text, which counts with
// OpenAI's o200k_base for models it does not know, is from the tokenizers
// of Claude, Gemini and DeepSeek on a small corpus (testdata/other_models.json:
// prose, code, YAML, JSON, French, German, Chinese, numbers, a table). The
// gateway's estimates for those models are approximations; this bounds
// how rough, and docs/gateway.md quotes the figures.
func TestOtherModelsApproximation(t *testing.T) {
	b, err := os.ReadFile("testdata/other_models.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus struct {
		Texts []struct {
			Name   string           `json:"name"`
			Text   string           `json:"text"`
			Counts map[string]int64 `json:"counts"`
		} `json:"texts"`
	}
	if err := json.Unmarshal(b, &corpus); err != nil {
		t.Fatal(err)
	}
	// maxTotal bounds the error over the whole corpus, maxOne that of one
	// text (numbers and CJK differ most).
	for _, m := range []struct {
		key, model       string
		maxTotal, maxOne float64
	}{
		{"claude", "claude-sonnet-4-5", 0.25, 0.60},
		{"gemini", "gemini-2.5-flash", 0.25, 0.60},
		{"deepseek", "deepseek-v3.2", 0.25, 0.60},
	} {
		var est, ref int64
		worst, worstName := 0.0, ""
		for _, c := range corpus.Texts {
			e, r := int64(Text(m.model, c.Text)), c.Counts[m.key]
			if r <= 0 {
				t.Fatalf("%s: no %s count", c.Name, m.key)
			}
			est, ref = est+e, ref+r
			if d := math.Abs(float64(e-r)) / float64(r); d > worst {
				worst, worstName = d, c.Name
			}
		}
		total := float64(est-ref) / float64(ref)
		t.Logf("%s (%s): estimate %d tokens, reference %d: %+.1f%% over the corpus; worst text %s at %.0f%%",
			m.model, m.key, est, ref, 100*total, worstName, 100*worst)
		if math.Abs(total) > m.maxTotal || worst > m.maxOne {
			t.Errorf("%s: error %+.1f%% over the corpus (bound %.0f%%), %.0f%% on %s (bound %.0f%%)",
				m.model, 100*total, 100*m.maxTotal, 100*worst, worstName, 100*m.maxOne)
		}
	}
}
