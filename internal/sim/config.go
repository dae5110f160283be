package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/llmgate/llmgate/clock"
)

// Defaults used by Config.withDefaults when a field is left at its zero value.
var (
	// DefaultModels are the chat models served when Config.Models is empty.
	DefaultModels = []string{"gpt-4.1", "gpt-4.1-mini", "gpt-4o-mini"}
	// DefaultEmbeddingModels are the embedding models served when
	// Config.EmbeddingModels is empty.
	DefaultEmbeddingModels = []string{"text-embedding-3-small"}
)

const (
	// DefaultEmbeddingDimensions is the vector length when neither the
	// config nor the request says otherwise (text-embedding-3-small's).
	DefaultEmbeddingDimensions = 1536
	// MaxEmbeddingDimensions bounds Config.EmbeddingDimensions and the
	// request's "dimensions".
	MaxEmbeddingDimensions = 3072
	// DefaultMaxBodyBytes is the largest request body accepted (1 MiB).
	DefaultMaxBodyBytes = 1 << 20
)

// Config describes one simulated provider. The zero value is usable: the
// default models, no limits, no latency, no faults, any API key accepted.
type Config struct {
	// Models are the chat model ids served by /v1/chat/completions.
	// Default DefaultModels.
	Models []string
	// EmbeddingModels are the model ids served by /v1/embeddings.
	// Default DefaultEmbeddingModels.
	EmbeddingModels []string

	// RPM is the requests-per-minute limit of each (API key, model) pair, as
	// OpenAI applies it; 0 means unlimited.
	RPM int64
	// TPM is the tokens-per-minute limit of each (API key, model) pair; a
	// request costs its estimated prompt tokens plus max_tokens (see
	// docs/mock.md); 0 means unlimited.
	TPM int64
	// Concurrency is the number of requests one API key may have in flight
	// at once, across models; 0 means unlimited.
	Concurrency int64
	// ITPM and OTPM are Anthropic's input and output tokens per minute of
	// each (API key, model) pair on /v1/messages (which RPM applies to as
	// well, TPM not): a request takes its input tokens and max_tokens up
	// front, and gets back what it did not generate when it ends, as
	// Anthropic estimates and then corrects its output limit. 0 means
	// unlimited.
	ITPM, OTPM int64

	// AzureDeployments maps an Azure deployment name to the model it
	// serves on /openai/deployments/{name}/...; a name not listed serves
	// the model of that name.
	AzureDeployments map[string]string

	// TTFT is the time to first token: how long a chat completion waits
	// before its first content (and an embedding before its answer).
	// Default 0.
	TTFT time.Duration
	// TokenDelay is the delay between two completion tokens. Default 0.
	TokenDelay time.Duration
	// Jitter scales every delay by a uniform random factor in
	// [1-Jitter, 1+Jitter]; it must be in [0, 1]. Default 0 (fixed delays).
	Jitter float64

	// ErrorRate is the probability, in [0, 1], that an admitted request is
	// answered with an injected 500 or 503 (OpenAI's server_error bodies).
	// Default 0.
	ErrorRate float64
	// DropRate is the probability, in [0, 1], that a streamed chat
	// completion has its connection dropped halfway through, without
	// [DONE]. Default 0.
	DropRate float64
	// Seed makes fault injection and jitter reproducible; 0 seeds from the
	// time. Answers are deterministic whatever the seed.
	Seed uint64

	// APIKeys, when not empty, are the only bearer tokens accepted; others
	// get 401 invalid_api_key. Empty means any key (or none) is accepted.
	APIKeys []string

	// EmbeddingDimensions is the vector length when the request does not
	// ask for one. Default DefaultEmbeddingDimensions.
	EmbeddingDimensions int
	// MaxBodyBytes is the largest request body accepted; larger ones get
	// 413. Default DefaultMaxBodyBytes.
	MaxBodyBytes int64

	// Clock is the time the rate limits refill on. Default clock.Real{};
	// latency always runs on real time.
	Clock clock.Clock
}

// withDefaults returns a copy of c with every zero field set to its default.
func (c Config) withDefaults() Config {
	if len(c.Models) == 0 {
		c.Models = append([]string(nil), DefaultModels...)
	}
	if len(c.EmbeddingModels) == 0 {
		c.EmbeddingModels = append([]string(nil), DefaultEmbeddingModels...)
	}
	if c.EmbeddingDimensions == 0 {
		c.EmbeddingDimensions = DefaultEmbeddingDimensions
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	return c
}

// Validate reports every setting that cannot work, with what to change.
// Zero values are valid: they mean the defaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("sim: "+format, args...)) }
	if c.RPM < 0 {
		bad("RPM is %d; use 0 for unlimited or a positive requests-per-minute limit", c.RPM)
	}
	if c.TPM < 0 {
		bad("TPM is %d; use 0 for unlimited or a positive tokens-per-minute limit", c.TPM)
	}
	if c.ITPM < 0 || c.OTPM < 0 {
		bad("ITPM is %d and OTPM %d; use 0 for unlimited or a positive tokens-per-minute limit", c.ITPM, c.OTPM)
	}
	if c.Concurrency < 0 {
		bad("Concurrency is %d; use 0 for unlimited or a positive number of requests in flight", c.Concurrency)
	}
	if c.TTFT < 0 {
		bad("TTFT is %v; use 0 or a positive duration such as 200ms", c.TTFT)
	}
	if c.TokenDelay < 0 {
		bad("TokenDelay is %v; use 0 or a positive duration such as 10ms", c.TokenDelay)
	}
	for name, v := range map[string]float64{"Jitter": c.Jitter, "ErrorRate": c.ErrorRate, "DropRate": c.DropRate} {
		if !(v >= 0 && v <= 1) { // also rejects NaN
			bad("%s is %v; it is a fraction between 0 and 1 (0.05 = 5%%)", name, v)
		}
	}
	if c.EmbeddingDimensions < 0 || c.EmbeddingDimensions > MaxEmbeddingDimensions {
		bad("EmbeddingDimensions is %d; use 0 for the default %d, or 1 to %d", c.EmbeddingDimensions, DefaultEmbeddingDimensions, MaxEmbeddingDimensions)
	}
	if c.MaxBodyBytes < 0 {
		bad("MaxBodyBytes is %d; use 0 for the default (1 MiB) or a positive size", c.MaxBodyBytes)
	}
	seen := map[string]string{}
	for _, list := range []struct {
		name string
		ids  []string
	}{{"Models", c.Models}, {"EmbeddingModels", c.EmbeddingModels}} {
		for _, id := range list.ids {
			switch {
			case strings.TrimSpace(id) == "" || strings.TrimSpace(id) != id:
				bad("%s has the model id %q; ids are non-empty, without surrounding spaces", list.name, id)
			case seen[id] != "":
				bad("model %q is listed twice (in %s and %s); list each model once", id, seen[id], list.name)
			default:
				seen[id] = list.name
			}
		}
	}
	for i, k := range c.APIKeys {
		if k == "" || strings.TrimSpace(k) != k {
			bad("APIKeys[%d] is empty or has surrounding spaces; a key is sent as 'Authorization: Bearer KEY'", i)
		}
	}
	return errors.Join(errs...)
}
