// Package scenario is the model of an `llmgate sim` experiment: a simulated provider with its quota, a gateway set-up and a client workload, read from YAML, with the built-in scenarios embedded.
package scenario

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Bounds on what a scenario may ask for: a run must stay small enough for
// one machine and stop by itself.
const (
	// MaxDuration bounds one arm of a run.
	MaxDuration = 60 * time.Second
	// DefaultDuration is an arm's bound when the file sets none.
	DefaultDuration = MaxDuration
	// MaxCallers bounds the concurrent client workers.
	MaxCallers = 2000
	// MaxRequests bounds the requests one caller sends.
	MaxRequests = 10_000
	// MaxReplicas bounds the gateway replicas.
	MaxReplicas = 16
	// MaxFileBytes bounds a scenario file.
	MaxFileBytes = 1 << 20
	// MaxSessions and MaxTurns bound a conversations workload.
	MaxSessions = 1000
	MaxTurns    = 100
	// MaxPromptWords bounds the generated prompts.
	MaxPromptWords = 2000
	// MaxModels bounds the models of a provider.
	MaxModels = 16
	// DefaultHeadroom is Gateway.Headroom's default.
	DefaultHeadroom = 0.01
	// DefaultModel is the model of a provider that lists none.
	DefaultModel = "gpt-4.1"
)

// Errors returned by this package.
var (
	// ErrSyntax wraps YAML that cannot be read into a Scenario (bad syntax,
	// an unknown key, a value of the wrong type); messages carry lines.
	ErrSyntax = errors.New("scenario: cannot parse")
	// ErrInvalid wraps every problem Validate finds.
	ErrInvalid = errors.New("scenario: invalid")
	// ErrUnknown means no built-in scenario has that name.
	ErrUnknown = errors.New("scenario: unknown")
)

// Scenario is one experiment. Durations are written like 500ms or 1m.
type Scenario struct {
	// Name identifies the scenario: lowercase letters, digits and '-'.
	Name string `yaml:"name"`
	// Description is one line saying what the scenario shows.
	Description string `yaml:"description"`
	// Duration bounds each arm: what is still running then is cut and
	// counted as failed. Default and maximum 60s.
	Duration time.Duration `yaml:"duration"`
	// Seed makes the workload, the jitter and the prompts reproducible.
	// Default 1.
	Seed uint64 `yaml:"seed"`
	// Replicas is the number of gateway replicas when --replicas is not
	// given. Default 1.
	Replicas int `yaml:"replicas"`
	// Provider is the simulated provider and its quota.
	Provider Provider `yaml:"provider"`
	// Fallback, if set, is a second provider serving the same models that
	// the gateway falls back to (the direct arm knows only Provider).
	Fallback *Provider `yaml:"fallback"`
	// Gateway is what the generated gateway configuration adds.
	Gateway Gateway `yaml:"gateway"`
	// Clients is the workload, the same in both arms.
	Clients Clients `yaml:"clients"`
	// Conversations, if set, makes the callers play chat sessions instead
	// of independent requests.
	Conversations *Conversations `yaml:"conversations"`
}

// Provider is a simulated provider (internal/sim): a quota per model and a
// latency.
type Provider struct {
	// RPM and TPM are the quota of each model, per minute; 0 = unlimited.
	RPM int64 `yaml:"rpm"`
	TPM int64 `yaml:"tpm"`
	// Concurrency is the number of requests in flight the provider
	// accepts at once, over all models; 0 = unlimited.
	Concurrency int64 `yaml:"concurrency"`
	// TTFT is the time to the first token; TokenDelay the time between
	// two tokens; each delay is scaled by a random factor in
	// [1-Jitter, 1+Jitter].
	TTFT       time.Duration `yaml:"ttft"`
	TokenDelay time.Duration `yaml:"token_delay"`
	Jitter     float64       `yaml:"jitter"`
	// ErrorRate is the share of admitted requests answered 500 or 503
	// (not billed).
	ErrorRate float64 `yaml:"error_rate"`
	// Models are the models served, each with optional limits and prices.
	// Default one model, gpt-4.1, at the provider's RPM and TPM.
	Models []Model `yaml:"models"`
	// Outage, if set, makes the provider answer every request with an
	// error for a while.
	Outage *Outage `yaml:"outage"`
}

// Model is one model of a provider.
type Model struct {
	Name string `yaml:"name"`
	// RPM and TPM replace the provider's for this model when not 0.
	RPM int64 `yaml:"rpm"`
	TPM int64 `yaml:"tpm"`
	// InputPerMTok and OutputPerMTok are prices in USD per million
	// tokens; 0 = the gateway's built-in price table's.
	InputPerMTok  float64 `yaml:"input_per_mtok"`
	OutputPerMTok float64 `yaml:"output_per_mtok"`
}

// Outage is a window during which the provider answers Status to every
// request.
type Outage struct {
	// Start is the time from the start of the arm.
	Start time.Duration `yaml:"start"`
	// Length is how long it lasts.
	Length time.Duration `yaml:"length"`
	// Status is 429 or 503 (default 503).
	Status int `yaml:"status"`
}

// Gateway is what the generated configuration of the replicas holds
// beyond the provider(s) and one tenant.
type Gateway struct {
	// MaxWait is how long a request may wait for admission. Default: the
	// clients' deadline less the provider's longest answer and a second,
	// so that an admitted request is answered before its client gives up
	// (a call cut by its client is refunded by the gateway though the
	// provider counted it).
	MaxWait time.Duration `yaml:"max_wait"`
	// Budget caps the tenant's spend per day.
	Budget *Budget `yaml:"budget"`
	// Headroom is the share of the provider's RPM and TPM the gateway's
	// limits leave unused (at least 2 requests and 2 tokens a minute): the
	// gateway cannot know when the provider's buckets started refilling,
	// and a request it admits may reach the provider a few milliseconds
	// after a later one. Default 0.01.
	Headroom *float64 `yaml:"headroom"`
	// LocalQuota is the gateway's ratelimit.local_quota on a Redis store:
	// each replica admits from blocks of quota reserved ahead, without a
	// store round trip per request. Default: the gateway's (on).
	LocalQuota *bool `yaml:"local_quota"`
}

// Budget is a tenant's cap.
type Budget struct {
	Tokens int64   `yaml:"tokens"`
	USD    float64 `yaml:"usd"`
}

// Clients is the workload.
type Clients struct {
	// Callers is the number of concurrent client workers. Required.
	Callers int `yaml:"callers"`
	// Requests is how many requests each caller sends, one after the
	// other; 0 = as many as fit in the duration.
	Requests int `yaml:"requests"`
	// Think is the pause between two requests of one caller.
	Think time.Duration `yaml:"think"`
	// Spread starts the callers evenly over this time (0: all at once).
	Spread time.Duration `yaml:"spread"`
	// Deadline bounds one request, retries and waiting included. Default
	// 30s.
	Deadline time.Duration `yaml:"deadline"`
	// Retries is how many times a client retries a request that got 429
	// or 5xx, after the provider's retry-after or an exponential backoff
	// from 500ms with jitter, as the OpenAI SDKs do (their default is 2).
	// Clients of the gateway send the same requests with the same retries.
	Retries int `yaml:"retries"`
	// PromptWords is the length of a generated prompt. Default 20.
	PromptWords int `yaml:"prompt_words"`
	// MaxTokens is the max_tokens of each request; 0 = none.
	MaxTokens int64 `yaml:"max_tokens"`
	// Identical groups the callers: each group of this many callers sends
	// the same prompts at the same moments (0 or 1: every prompt differs).
	Identical int `yaml:"identical"`
	// Mix is the share of requests per model and priority. Default: all
	// to the provider's first model, interactive.
	Mix []Class `yaml:"mix"`
}

// Class is one kind of request in the mix.
type Class struct {
	Model string `yaml:"model"`
	// Weight is the relative share (default 1).
	Weight float64 `yaml:"weight"`
	// Priority is interactive (default) or batch (sent as
	// x-llmgate-priority).
	Priority string `yaml:"priority"`
}

// Conversations is a chat workload: each session sends Turns user
// messages, one every Gap, each with the history its caller knows, to a
// random replica; some messages are sent twice.
type Conversations struct {
	// Sessions is the number of conversations, spread over the callers
	// (pods). Required.
	Sessions int `yaml:"sessions"`
	// Turns is the number of user messages per session. Default 5.
	Turns int `yaml:"turns"`
	// Gap is the time between two user messages of a session (they do not
	// wait for the previous answer). Default 1s.
	Gap time.Duration `yaml:"gap"`
	// DuplicateShare is the share of the messages sent that are
	// duplicates of another (a retry by the client, a queue delivering
	// twice): 0.3 means 30 of every 100 sent.
	DuplicateShare float64 `yaml:"duplicate_share"`
}

// Priorities of a Class.
const (
	PriorityInteractive = "interactive"
	PriorityBatch       = "batch"
)

//go:embed scenarios/*.yaml
var builtinFS embed.FS

// Builtin is a built-in scenario's name and description.
type Builtin struct {
	Name, Description string
}

// order is the order --list shows the built-ins in (the issue's).
var order = []string{"burst", "duplicates", "conversations", "models", "outage", "budget"}

// List returns the built-in scenarios in their documented order.
func List() []Builtin {
	entries, _ := builtinFS.ReadDir("scenarios")
	var out []Builtin
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".yaml")
		s, err := Load(name)
		if err != nil {
			continue // the tests check that every built-in loads
		}
		out = append(out, Builtin{Name: name, Description: s.Description})
	}
	slices.SortStableFunc(out, func(a, b Builtin) int { return rank(a.Name) - rank(b.Name) })
	return out
}

func rank(name string) int {
	if i := slices.Index(order, name); i >= 0 {
		return i
	}
	return len(order)
}

// Source returns the YAML of a built-in scenario, for a user to copy and
// edit.
func Source(name string) ([]byte, error) {
	if !nameRE.MatchString(name) {
		return nil, unknown(name)
	}
	b, err := builtinFS.ReadFile(path.Join("scenarios", name+".yaml"))
	if err != nil {
		return nil, unknown(name)
	}
	return b, nil
}

func unknown(name string) error {
	var names []string
	for _, b := range List() {
		names = append(names, b.Name)
	}
	return fmt.Errorf("%w scenario %q; the built-ins are %s (llmgate sim --list), or give a YAML file", ErrUnknown, name, strings.Join(names, ", "))
}

// Load returns a built-in scenario, defaults filled and validated.
func Load(name string) (*Scenario, error) {
	b, err := Source(name)
	if err != nil {
		return nil, err
	}
	return Parse(name+".yaml", b)
}

// Parse reads a scenario from YAML strictly (unknown keys and repeated
// documents are errors), fills defaults and validates it. name is used in
// messages.
func Parse(name string, data []byte) (*Scenario, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%w %s: larger than %d bytes; a scenario is a few hundred", ErrSyntax, name, MaxFileBytes)
	}
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w %s: the file is empty; start from 'llmgate sim --show burst'", ErrSyntax, name)
		}
		return nil, fmt.Errorf("%w %s: %s", ErrSyntax, name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w %s: more than one YAML document; a file holds one scenario", ErrSyntax, name)
	}
	s.SetDefaults()
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &s, nil
}

// SetDefaults fills every unset field with its default.
func (s *Scenario) SetDefaults() {
	if s.Duration == 0 {
		s.Duration = DefaultDuration
	}
	if s.Seed == 0 {
		s.Seed = 1
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	for _, p := range []*Provider{&s.Provider, s.Fallback} {
		if p == nil {
			continue
		}
		if len(p.Models) == 0 {
			p.Models = []Model{{Name: DefaultModel}}
		}
		if p.Outage != nil && p.Outage.Status == 0 {
			p.Outage.Status = 503
		}
	}
	c := &s.Clients
	if c.Deadline == 0 {
		c.Deadline = 30 * time.Second
	}
	if c.PromptWords == 0 {
		c.PromptWords = 20
	}
	if len(c.Mix) == 0 && len(s.Provider.Models) > 0 {
		c.Mix = []Class{{Model: s.Provider.Models[0].Name}}
	}
	for i := range c.Mix {
		if c.Mix[i].Weight == 0 {
			c.Mix[i].Weight = 1
		}
		if c.Mix[i].Priority == "" {
			c.Mix[i].Priority = PriorityInteractive
		}
	}
	if s.Gateway.Headroom == nil {
		h := DefaultHeadroom
		s.Gateway.Headroom = &h
	}
	if s.Gateway.MaxWait == 0 {
		s.Gateway.MaxWait = max(c.Deadline-s.Provider.longestAnswer()-time.Second, 0)
	}
	if cv := s.Conversations; cv != nil {
		if cv.Turns == 0 {
			cv.Turns = 5
		}
		if cv.Gap == 0 {
			cv.Gap = time.Second
		}
	}
}

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	modelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$`)
)

// Validate reports every setting that cannot work, each with what to
// write instead.
func (s *Scenario) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	if !nameRE.MatchString(s.Name) {
		bad("name", "%q is not a name; use lowercase letters, digits and '-' (at most 63)", s.Name)
	}
	if strings.ContainsAny(s.Description, "\n\r") || len(s.Description) > 200 {
		bad("description", "is one line of at most 200 characters")
	}
	if s.Duration < 0 || s.Duration > MaxDuration {
		bad("duration", "is %v; use a duration up to %v, e.g. 20s", s.Duration, MaxDuration)
	}
	if s.Replicas < 0 || s.Replicas > MaxReplicas {
		bad("replicas", "is %d; use 1 to %d", s.Replicas, MaxReplicas)
	}
	models := map[string]bool{}
	s.Provider.validate("provider", bad, models)
	if s.Fallback != nil {
		fb := map[string]bool{}
		s.Fallback.validate("fallback", bad, fb)
		for m := range models {
			if !fb[m] {
				bad("fallback.models", "lacks %q; a fallback serves every model of the provider", m)
			}
		}
	}
	if b := s.Gateway.Budget; b != nil {
		if b.Tokens < 0 || b.USD < 0 || math.IsNaN(b.USD) || math.IsInf(b.USD, 0) || (b.Tokens == 0 && b.USD == 0) {
			bad("gateway.budget", "needs tokens or usd, positive")
		}
	}
	if h := s.Gateway.Headroom; h != nil && !(*h >= 0 && *h < 0.5) {
		bad("gateway.headroom", "is %v; a fraction from 0 to below 0.5 (0.01 = 1%%)", *h)
	}
	if s.Gateway.MaxWait < 0 || s.Gateway.MaxWait > 10*time.Minute {
		bad("gateway.max_wait", "is %v; use 0s to 10m", s.Gateway.MaxWait)
	}
	c := &s.Clients
	if c.Callers < 1 || c.Callers > MaxCallers {
		bad("clients.callers", "is %d; use 1 to %d", c.Callers, MaxCallers)
	}
	if c.Requests < 0 || c.Requests > MaxRequests {
		bad("clients.requests", "is %d; use 0 (as many as fit in the duration) to %d", c.Requests, MaxRequests)
	}
	for f, d := range map[string]time.Duration{"clients.think": c.Think, "clients.spread": c.Spread} {
		if d < 0 || d > MaxDuration {
			bad(f, "is %v; use 0s to %v", d, MaxDuration)
		}
	}
	if c.Deadline <= 0 || c.Deadline > 10*time.Minute {
		bad("clients.deadline", "is %v; use a duration up to 10m, e.g. 30s", c.Deadline)
	}
	if c.Retries < 0 || c.Retries > 10 {
		bad("clients.retries", "is %d; use 0 to 10 (the OpenAI SDKs retry 2 times)", c.Retries)
	}
	if c.PromptWords < 1 || c.PromptWords > MaxPromptWords {
		bad("clients.prompt_words", "is %d; use 1 to %d", c.PromptWords, MaxPromptWords)
	}
	if c.MaxTokens < 0 || c.MaxTokens > 100_000 {
		bad("clients.max_tokens", "is %d; use 0 (none) to 100000", c.MaxTokens)
	}
	if c.Identical < 0 || c.Identical > MaxCallers {
		bad("clients.identical", "is %d; use 0 (all prompts differ) or a group size up to %d", c.Identical, MaxCallers)
	}
	if len(c.Mix) > 32 {
		bad("clients.mix", "has %d classes; at most 32", len(c.Mix))
	}
	for i, cl := range c.Mix {
		at := fmt.Sprintf("clients.mix[%d]", i)
		if !models[cl.Model] {
			bad(at+".model", "%q is not one of provider.models", cl.Model)
		}
		if !(cl.Weight > 0) || math.IsInf(cl.Weight, 0) {
			bad(at+".weight", "is %v; use a positive share", cl.Weight)
		}
		if cl.Priority != PriorityInteractive && cl.Priority != PriorityBatch {
			bad(at+".priority", "is %q; use interactive or batch", cl.Priority)
		}
	}
	if cv := s.Conversations; cv != nil {
		if cv.Sessions < 1 || cv.Sessions > MaxSessions {
			bad("conversations.sessions", "is %d; use 1 to %d", cv.Sessions, MaxSessions)
		}
		if cv.Turns < 1 || cv.Turns > MaxTurns {
			bad("conversations.turns", "is %d; use 1 to %d", cv.Turns, MaxTurns)
		}
		if cv.Gap <= 0 || cv.Gap > MaxDuration {
			bad("conversations.gap", "is %v; use a positive duration up to %v", cv.Gap, MaxDuration)
		}
		if !(cv.DuplicateShare >= 0 && cv.DuplicateShare <= 0.5) {
			bad("conversations.duplicate_share", "is %v; use a fraction from 0 to 0.5 (0.3 = 30%% of the messages sent are duplicates)", cv.DuplicateShare)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(errs...))
}

func (p *Provider) validate(at string, bad func(string, string, ...any), models map[string]bool) {
	if p.RPM < 0 || p.TPM < 0 || p.Concurrency < 0 || p.RPM > 1e9 || p.TPM > 1e12 || p.Concurrency > 1e6 {
		bad(at, "rpm, tpm and concurrency are 0 (unlimited) or positive")
	}
	if p.TTFT < 0 || p.TokenDelay < 0 || p.TTFT > MaxDuration || p.TokenDelay > time.Second {
		bad(at, "ttft is 0s to %v and token_delay 0s to 1s", MaxDuration)
	}
	if !(p.Jitter >= 0 && p.Jitter <= 1) {
		bad(at+".jitter", "is %v; a fraction from 0 to 1", p.Jitter)
	}
	if !(p.ErrorRate >= 0 && p.ErrorRate <= 1) {
		bad(at+".error_rate", "is %v; a fraction from 0 to 1", p.ErrorRate)
	}
	if len(p.Models) > MaxModels {
		bad(at+".models", "has %d models; at most %d", len(p.Models), MaxModels)
	}
	for i, m := range p.Models {
		mat := fmt.Sprintf("%s.models[%d]", at, i)
		switch {
		case !modelRE.MatchString(m.Name) || strings.Contains(m.Name, "embedding"):
			bad(mat+".name", "%q is not a chat model id (letters, digits, '.', '_', ':', '-')", m.Name)
		case models[m.Name]:
			bad(mat+".name", "%q is listed twice", m.Name)
		}
		models[m.Name] = true
		if m.RPM < 0 || m.TPM < 0 || m.RPM > 1e9 || m.TPM > 1e12 {
			bad(mat, "rpm and tpm are 0 (the provider's) or positive")
		}
		for _, v := range []float64{m.InputPerMTok, m.OutputPerMTok} {
			if !(v >= 0 && v < 1e6) {
				bad(mat, "prices are USD per million tokens, 0 or positive")
			}
		}
	}
	if o := p.Outage; o != nil {
		if o.Start < 0 || o.Length <= 0 || o.Start+o.Length > MaxDuration {
			bad(at+".outage", "start and length are positive durations ending within %v", MaxDuration)
		}
		if o.Status != 429 && o.Status != 503 {
			bad(at+".outage.status", "is %d; use 429 or 503", o.Status)
		}
	}
}

// longestAnswer bounds the time the provider takes to answer: the
// simulator's answers are at most 47 tokens.
func (p *Provider) longestAnswer() time.Duration {
	return time.Duration(float64(p.TTFT+47*p.TokenDelay) * (1 + p.Jitter))
}

// Limits returns the RPM and TPM of model m at p.
func (p *Provider) Limits(m Model) (rpm, tpm int64) {
	rpm, tpm = p.RPM, p.TPM
	if m.RPM != 0 {
		rpm = m.RPM
	}
	if m.TPM != 0 {
		tpm = m.TPM
	}
	return rpm, tpm
}
