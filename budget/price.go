package budget

import (
	"fmt"
	"maps"
	"math"
	"math/bits"
	"regexp"
	"slices"
)

// Price is what a model costs, in US dollars per million tokens.
type Price struct {
	// InputPerMTok is the price of prompt tokens that were not served from
	// the provider's prompt cache.
	InputPerMTok float64 `json:"input_per_mtok" yaml:"input_per_mtok"`
	// OutputPerMTok is the price of completion tokens (reasoning tokens
	// included: providers bill them as output).
	OutputPerMTok float64 `json:"output_per_mtok" yaml:"output_per_mtok"`
	// CachedInputPerMTok is the price of prompt tokens served from the
	// provider's prompt cache. Zero means the provider has no cached price
	// and such tokens cost InputPerMTok.
	CachedInputPerMTok float64 `json:"cached_input_per_mtok,omitempty" yaml:"cached_input_per_mtok,omitempty"`
}

// maxPricePerMTok bounds a price so that cost arithmetic cannot overflow:
// $1,000,000 per million tokens is far above any real model.
const maxPricePerMTok = 1e6

// Validate reports a price that cannot be right.
func (p Price) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"InputPerMTok", p.InputPerMTok}, {"OutputPerMTok", p.OutputPerMTok}, {"CachedInputPerMTok", p.CachedInputPerMTok}} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > maxPricePerMTok {
			return fmt.Errorf("%w: price %s = %v: want a number of US dollars per million tokens between 0 and %v", ErrInvalid, f.name, f.v, float64(maxPricePerMTok))
		}
	}
	return nil
}

// PriceTable maps a model name, as sent in requests and reported in
// responses, to its price.
type PriceTable map[string]Price

// DefaultPrices returns a new table of list prices for common models, in US
// dollars per million tokens at the providers' standard (not batch, not
// priority) tier.
//
// The figures are the providers' published list prices as of August 2025,
// the latest this code's authors checked. Prices change: check them against
// the provider's pricing page and override them in configuration (see
// PriceTable.Merge). Anthropic's cache-write surcharge is not modelled;
// cache reads use CachedInputPerMTok.
func DefaultPrices() PriceTable {
	return PriceTable{
		// OpenAI, https://openai.com/api/pricing (August 2025).
		"gpt-5":                  {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10},
		"gpt-5-mini":             {InputPerMTok: 0.25, CachedInputPerMTok: 0.025, OutputPerMTok: 2},
		"gpt-5-nano":             {InputPerMTok: 0.05, CachedInputPerMTok: 0.005, OutputPerMTok: 0.40},
		"gpt-4.1":                {InputPerMTok: 2, CachedInputPerMTok: 0.50, OutputPerMTok: 8},
		"gpt-4.1-mini":           {InputPerMTok: 0.40, CachedInputPerMTok: 0.10, OutputPerMTok: 1.60},
		"gpt-4.1-nano":           {InputPerMTok: 0.10, CachedInputPerMTok: 0.025, OutputPerMTok: 0.40},
		"gpt-4o":                 {InputPerMTok: 2.50, CachedInputPerMTok: 1.25, OutputPerMTok: 10},
		"gpt-4o-mini":            {InputPerMTok: 0.15, CachedInputPerMTok: 0.075, OutputPerMTok: 0.60},
		"o3":                     {InputPerMTok: 2, CachedInputPerMTok: 0.50, OutputPerMTok: 8},
		"o3-mini":                {InputPerMTok: 1.10, CachedInputPerMTok: 0.55, OutputPerMTok: 4.40},
		"o4-mini":                {InputPerMTok: 1.10, CachedInputPerMTok: 0.275, OutputPerMTok: 4.40},
		"o1":                     {InputPerMTok: 15, CachedInputPerMTok: 7.50, OutputPerMTok: 60},
		"text-embedding-3-small": {InputPerMTok: 0.02},
		"text-embedding-3-large": {InputPerMTok: 0.13},
		"text-embedding-ada-002": {InputPerMTok: 0.10},
		// Anthropic, https://www.anthropic.com/pricing (August 2025).
		"claude-sonnet-4":   {InputPerMTok: 3, CachedInputPerMTok: 0.30, OutputPerMTok: 15},
		"claude-sonnet-4-0": {InputPerMTok: 3, CachedInputPerMTok: 0.30, OutputPerMTok: 15},
		"claude-opus-4-1":   {InputPerMTok: 15, CachedInputPerMTok: 1.50, OutputPerMTok: 75},
		"claude-3-5-haiku":  {InputPerMTok: 0.80, CachedInputPerMTok: 0.08, OutputPerMTok: 4},
		// Anthropic, the 4.5 models (November 2025): both spellings, the
		// API's ids use dashes. Cache writes (1.25x the input price) are
		// charged as input.
		"claude-sonnet-4-5": {InputPerMTok: 3, CachedInputPerMTok: 0.30, OutputPerMTok: 15},
		"claude-sonnet-4.5": {InputPerMTok: 3, CachedInputPerMTok: 0.30, OutputPerMTok: 15},
		"claude-haiku-4-5":  {InputPerMTok: 1, CachedInputPerMTok: 0.10, OutputPerMTok: 5},
		"claude-haiku-4.5":  {InputPerMTok: 1, CachedInputPerMTok: 0.10, OutputPerMTok: 5},
		"claude-opus-4-5":   {InputPerMTok: 5, CachedInputPerMTok: 0.50, OutputPerMTok: 25},
		"claude-opus-4.5":   {InputPerMTok: 5, CachedInputPerMTok: 0.50, OutputPerMTok: 25},
		// Google, https://ai.google.dev/gemini-api/docs/pricing (text
		// input, prompts up to 200k tokens; November 2025).
		"gemini-2.5-pro":        {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10},
		"gemini-2.5-flash":      {InputPerMTok: 0.30, CachedInputPerMTok: 0.03, OutputPerMTok: 2.50},
		"gemini-2.5-flash-lite": {InputPerMTok: 0.10, CachedInputPerMTok: 0.01, OutputPerMTok: 0.40},
		// DeepSeek, https://api-docs.deepseek.com/quick_start/pricing
		// (V3.2, November 2025): its API serves V3.2 as deepseek-chat and
		// deepseek-reasoner, at one price.
		"deepseek-v3.2":     {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42},
		"deepseek-chat":     {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42},
		"deepseek-reasoner": {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42},
	}
}

// Merge returns a new table holding t's entries overridden and extended by
// over's; neither input is changed. Use it to load configured prices on top
// of DefaultPrices.
func (t PriceTable) Merge(over PriceTable) PriceTable {
	out := make(PriceTable, len(t)+len(over))
	maps.Copy(out, t)
	maps.Copy(out, over)
	return out
}

// Validate reports the first model (in name order) whose price is invalid.
func (t PriceTable) Validate() error {
	for _, m := range slices.Sorted(maps.Keys(t)) {
		if m == "" {
			return fmt.Errorf("%w: price table has an entry with an empty model name", ErrInvalid)
		}
		if err := t[m].Validate(); err != nil {
			return fmt.Errorf("model %q: %w", m, err)
		}
	}
	return nil
}

// datedSuffix matches the snapshot date providers append to model names in
// responses: "gpt-4o-2024-08-06", "claude-sonnet-4-20250514".
var datedSuffix = regexp.MustCompile(`-(\d{4}-\d{2}-\d{2}|20\d{6})$`)

// Lookup returns the price of model. A name not in the table is tried again
// without a trailing snapshot date ("gpt-4.1-2025-04-14" is priced as
// "gpt-4.1", "claude-sonnet-4-20250514" as "claude-sonnet-4").
func (t PriceTable) Lookup(model string) (Price, bool) {
	if p, ok := t[model]; ok {
		return p, true
	}
	if loc := datedSuffix.FindStringIndex(model); loc != nil && loc[0] > 0 {
		base := model[:loc[0]]
		if p, ok := t[base]; ok {
			return p, true
		}
	}
	return Price{}, false
}

// Cost returns what u costs on model in micro-dollars (1 USD = 1,000,000),
// and whether the model has a price. Cached tokens are part of the prompt
// tokens (as in OpenAI's usage.prompt_tokens_details.cached_tokens) and are
// charged at the cached price where the model has one. The sum is exact in
// integer arithmetic and rounded up once, to the next micro-dollar, so many
// small requests never cost less in total than they did.
func (t PriceTable) Cost(model string, u Usage) (microUSD int64, known bool) {
	p, ok := t.Lookup(model)
	if !ok {
		return 0, false
	}
	return p.cost(u), true
}

// cost is u's price in micro-dollars, rounded up; negative counts count as
// zero and cached tokens beyond the prompt count as uncached prompt tokens.
func (p Price) cost(u Usage) int64 {
	prompt, completion, cached := max(u.PromptTokens, 0), max(u.CompletionTokens, 0), max(u.CachedTokens, 0)
	cached = min(cached, prompt)
	in, out, cin := micro(p.InputPerMTok), micro(p.OutputPerMTok), micro(p.CachedInputPerMTok)
	if p.CachedInputPerMTok == 0 {
		cin = in
	}
	// total = tokens × (µUSD per million tokens) / 1e6, summed in 128 bits.
	var hi, lo uint64
	add := func(tokens int64, price uint64) {
		h, l := bits.Mul64(uint64(tokens), price)
		var c uint64
		lo, c = bits.Add64(lo, l, 0)
		hi, _ = bits.Add64(hi, h, c)
	}
	add(prompt-cached, in)
	add(cached, cin)
	add(completion, out)
	const perM = 1_000_000
	if hi >= perM {
		return math.MaxInt64 // beyond any real bill; saturate instead of wrapping
	}
	q, r := bits.Div64(hi, lo, perM)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// micro converts USD per million tokens to micro-dollars per million tokens.
func micro(usd float64) uint64 {
	if !(usd > 0) { // also NaN
		return 0
	}
	return uint64(math.Round(min(usd, maxPricePerMTok) * 1e6))
}
