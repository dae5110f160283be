// Package storeurl turns a --store URL into a connected store client, with errors that never show a password.
package storeurl

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

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
	// ErrSentinelAuth is the failure of a URL with sentinel_username or
	// sentinel_password but no master_set; it comes wrapped with
	// ErrBadURL.
	ErrSentinelAuth = errors.New("sentinel_username and sentinel_password need master_set (a Sentinel URL)")
)

// IsMemory reports whether s names the embedded in-process store.
func IsMemory(s string) bool {
	return s == "memory" || s == "memory://" || s == "mem"
}

// Redact returns s with any password replaced by "xxxxx", for messages:
// the user part, and the value of every query parameter whose name holds
// "pass" (sentinel_password).
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i := strings.Index(s, "@"); i >= 0 {
			if j := strings.Index(s, "://"); j >= 0 && j < i {
				return redactQuery(s[:j+3] + "xxxxx" + s[i:])
			}
			return redactQuery("xxxxx" + s[i:])
		}
		return redactQuery(s)
	}
	// A bare user part ("redis://token@host") may be a secret too.
	u.User = url.User("xxxxx")
	return redactQuery(u.String())
}

// redactQuery replaces the values of query parameters whose name holds
// "pass" by "xxxxx". It reads the text after the first '?' itself, split
// at '&' and ';', rather than through url.ParseQuery, which drops the
// pieces it cannot parse along with the secrets they may hold.
func redactQuery(s string) string {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	var b strings.Builder
	b.WriteString(s[:q+1])
	start := q + 1
	for i := start; i <= len(s); i++ {
		if i < len(s) && s[i] != '&' && s[i] != ';' {
			continue
		}
		piece := s[start:i]
		name, _, hasValue := strings.Cut(piece, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if hasValue && strings.Contains(strings.ToLower(name), "pass") {
			piece = piece[:strings.IndexByte(piece, '=')+1] + "xxxxx"
		}
		b.WriteString(piece)
		if i < len(s) {
			b.WriteByte(s[i])
		}
		start = i + 1
	}
	return b.String()
}

// RedisOption parses a redis://, rediss:// or unix:// URL into client
// options (see rueidis.ParseURL for the query parameters it accepts, and
// DefaultConnections for ?connections=N). Several comma-separated hosts,
// or addr= parameters, are seeds: the nodes of a Cluster, or with
// ?master_set=NAME the sentinels that name the master. The URL's user and
// password are the data nodes'; the sentinels' own, when they require
// one, come as ?sentinel_username=U&sentinel_password=P.
func RedisOption(s string) (rueidis.ClientOption, error) {
	if IsMemory(s) {
		return rueidis.ClientOption{}, ErrMemory
	}
	if s == "" {
		return rueidis.ClientOption{}, fmt.Errorf("%w: empty; want redis://host:port[/db]", ErrBadURL)
	}
	expanded, err := expandHosts(s)
	if err != nil {
		return rueidis.ClientOption{}, err
	}
	opt, err := rueidis.ParseURL(expanded)
	if err != nil {
		// rueidis's message may quote the URL; do not pass it on.
		return rueidis.ClientOption{}, fmt.Errorf("%w %q: want redis://[user:password@]host:port[,host:port...][/db][?master_set=NAME], rediss://... or unix:///path", ErrBadURL, Redact(s))
	}
	opt.DisableCache = true // the lock and limiter never read through a client-side cache
	if opt.Sentinel.Username, opt.Sentinel.Password, err = sentinelAuth(expanded, opt.Sentinel.MasterSet != ""); err != nil {
		return rueidis.ClientOption{}, fmt.Errorf("%w %q: %w", ErrBadURL, Redact(s), err)
	}
	if opt.Sentinel.MasterSet != "" {
		// The addresses are the sentinels'. rueidis dials them with the
		// Sentinel options only: give them the same dial timeout and TLS.
		// The URL's user and password are the master's and replicas'; the
		// sentinels get sentinel_username and sentinel_password (none:
		// no AUTH).
		opt.Sentinel.Dialer = opt.Dialer
		if opt.TLSConfig != nil {
			opt.Sentinel.TLSConfig = opt.TLSConfig.Clone()
		}
		// Without it the client follows a failover only through the
		// +switch-master event; one missed event would leave it on a
		// demoted master (rueidis's SentinelOption doc).
		opt.Sentinel.TopologyRefreshInterval = SentinelRefresh
	}
	if opt.PipelineMultiplex, err = pipelineMultiplex(s); err != nil {
		return rueidis.ClientOption{}, err
	}
	return opt, nil
}

// sentinelAuth reads the sentinels' credentials from the query of s,
// which rueidis parsed already (so it parses). They only mean something
// with master_set: without it, they are a mistake worth an error.
func sentinelAuth(s string, sentinel bool) (user, password string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", nil
	}
	q := u.Query()
	if !sentinel && (q.Has("sentinel_username") || q.Has("sentinel_password")) {
		return "", "", ErrSentinelAuth
	}
	return q.Get("sentinel_username"), q.Get("sentinel_password"), nil
}

// SentinelRefresh is how often a client of a Sentinel URL asks the
// sentinels which node is master, besides listening for their failover
// events.
const SentinelRefresh = 2 * time.Second

// expandHosts rewrites redis://h1:p1,h2:p2,.../... as
// redis://h1:p1/...?addr=h2:p2&addr=..., the form rueidis.ParseURL reads
// (it takes one host; more seeds, Cluster nodes or sentinels, come as
// addr= parameters). Every extra seed needs its port: rueidis would dial a
// port-less addr= on the first host's name.
func expandHosts(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return s, nil // rueidis.ParseURL reports what is wrong
	}
	q := u.Query()
	hosts := strings.Split(u.Host, ",")
	if len(hosts) == 1 && !q.Has("addr") {
		return s, nil
	}
	for i, h := range append(slices.Clone(hosts), q["addr"]...) {
		if i == 0 && len(hosts) == 1 {
			continue // the one host: rueidis's defaults apply
		}
		if err := checkHostPort(h); err != nil {
			return "", fmt.Errorf("%w %q: %w", ErrBadURL, Redact(s), err)
		}
	}
	if len(hosts) == 1 {
		return s, nil
	}
	q["addr"] = append(hosts[1:], q["addr"]...)
	u.Host = hosts[0]
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// checkHostPort accepts host:port with a port from 1 to 65535.
func checkHostPort(h string) error {
	host, port, err := net.SplitHostPort(h)
	if err != nil || host == "" {
		return fmt.Errorf("seed %q is not host:port", h)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("seed %q has a bad port", h)
	}
	return nil
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
func OpenRedis(s string) (rueidis.Client, error) { return OpenRedisWith(s, nil) }

// OpenRedisWith is OpenRedis with the options of s changed by edit (when
// not nil) before connecting.
func OpenRedisWith(s string, edit func(*rueidis.ClientOption)) (rueidis.Client, error) {
	opt, err := RedisOption(s)
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(&opt)
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
	u, perr := url.Parse(s)
	if perr != nil {
		return msg
	}
	if u.User != nil {
		if p, has := u.User.Password(); has && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
		if n := u.User.Username(); n != "" {
			msg = strings.ReplaceAll(msg, n, "xxxxx")
		}
	}
	if p := u.Query().Get("sentinel_password"); p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}
