// Package storeurl turns a --store URL into a connected store client, with errors that never show a password.
package storeurl

import (
	"errors"
	"fmt"
	"net/url"
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
// options (see rueidis.ParseURL for the query parameters it accepts).
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
	return opt, nil
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
