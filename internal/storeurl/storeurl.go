// Package storeurl turns a --store URL into a connected store client, with errors that never show a password.
package storeurl

import (
	"errors"
	"fmt"
	"math/bits"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// Errors about a store URL.
var (
	// ErrMemory is returned by OpenRedis for "memory": an in-process store
	// cannot coordinate separate processes.
	ErrMemory = errors.New("storeurl: the memory store lives inside one process")
	// ErrBadURL wraps every parse failure.
	ErrBadURL = errors.New("storeurl: bad store URL")
	// ErrBadConnections is the failure of a well-formed URL whose
	// ?connections=N is not a power of two from 1 to MaxConnections; it
	// comes wrapped with ErrBadURL.
	ErrBadConnections = fmt.Errorf("connections must be a power of two from 1 to %d", MaxConnections)
)

// IsMemory reports whether s names the embedded in-process store.
func IsMemory(s string) bool {
	return s == "memory" || s == "memory://" || s == "mem"
}

// Redact returns s with any password replaced by "xxxxx", for messages.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.Index(s, "@"); i >= 0 {
			if j := strings.Index(s, "://"); j >= 0 && j < i {
				return s[:j+3] + "xxxxx" + s[i:]
			}
			return "xxxxx" + s[i:]
		}
		return s
	}
	// A bare user part ("redis://token@host") may be a secret too.
	u.User = url.User("xxxxx")
	return u.String()
}

// RedisOption parses a redis://, rediss:// or unix:// URL into client
// options (see rueidis.ParseURL for the query parameters it accepts, and
// DefaultConnections for ?connections=N).
func RedisOption(s string) (rueidis.ClientOption, error) {
	if IsMemory(s) {
		return rueidis.ClientOption{}, ErrMemory
	}
	if s == "" {
		return rueidis.ClientOption{}, fmt.Errorf("%w: empty; want redis://host:port[/db]", ErrBadURL)
	}
	opt, err := rueidis.ParseURL(s)
	if err != nil {
		// rueidis's message may quote the URL; do not pass it on.
		return rueidis.ClientOption{}, fmt.Errorf("%w %q: want redis://[user:password@]host:port[/db], rediss://... or unix:///path", ErrBadURL, Redact(s))
	}
	opt.DisableCache = true // the lock and limiter never read through a client-side cache
	if opt.PipelineMultiplex, err = pipelineMultiplex(s); err != nil {
		return rueidis.ClientOption{}, err
	}
	return opt, nil
}

// DefaultConnections is how many connections a client pipelines its
// commands over when the URL does not say (?connections=N).
//
// Why one, where rueidis opens two on two cores and four on more: many
// goroutines sharing one connection have their commands written together
// and their replies read together, one system call for several, and Redis
// (one thread) serves them in order either way, so more connections only
// add system calls (BENCHMARKS.md has the lock figures). Pub/Sub and
// blocking commands keep their own connections.
const DefaultConnections = 1

// MaxConnections bounds ?connections=N (rueidis.MaxPipelineMultiplex).
const MaxConnections = 1 << rueidis.MaxPipelineMultiplex

// pipelineMultiplex reads ?connections=N from s (a power of two, 1 to
// MaxConnections) as rueidis's PipelineMultiplex, which is its log2 except
// that 0 means rueidis's default: one connection is -1.
func pipelineMultiplex(s string) (int, error) {
	n := DefaultConnections
	if u, err := url.Parse(s); err == nil {
		if q := u.Query(); q.Has("connections") {
			n, err = strconv.Atoi(q.Get("connections"))
			if err != nil || n < 1 || n > MaxConnections || n&(n-1) != 0 {
				return 0, fmt.Errorf("%w %q: %w", ErrBadURL, Redact(s), ErrBadConnections)
			}
		}
	}
	if n == 1 {
		return -1, nil
	}
	return bits.TrailingZeros(uint(n)), nil
}

// OpenRedis connects to the Redis named by s. It fails fast, with a
// password-free message, when the URL is bad or the server is unreachable.
func OpenRedis(s string) (rueidis.Client, error) {
	opt, err := RedisOption(s)
	if err != nil {
		return nil, err
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("storeurl: cannot connect to %s: %s", Redact(s), redactErr(err, s))
	}
	return c, nil
}

// redactErr renders err without any password that s carried.
func redactErr(err error, s string) string {
	msg := err.Error()
	if u, perr := url.Parse(s); perr == nil && u.User != nil {
		if p, has := u.User.Password(); has && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
		if n := u.User.Username(); n != "" {
			msg = strings.ReplaceAll(msg, n, "xxxxx")
		}
	}
	return msg
}
