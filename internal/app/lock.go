package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/lock"
)

const lockUsageText = `Usage:
  llmgate lock --store URL --key NAME [flags] -- CMD [ARGS...]

Runs CMD while holding the distributed lock NAME: flock(1) across machines.
The lease is renewed every TTL/3 while CMD runs and released when CMD exits;
llmgate then exits with CMD's status. If the lock is lost while CMD runs
(the store lost it, or it could not be renewed in time), CMD gets SIGTERM,
then SIGKILL after --grace, and llmgate exits 75.

Flags:
  --store URL    the coordination store: redis://[user:password@]host:port[/db],
                 rediss://... or unix:///path (default $LLMGATE_STORE)
  --key NAME     the lock's name (required)
  --ttl D        lease duration; a crashed holder frees the lock after at most
                 this long (default 10s, minimum 10ms)
  --wait D       how long to wait for the lock; 0 tries once and gives up if it
                 is held (default 0)
  --fair         queue strictly in arrival order across all processes
  --grace D      after the lock is lost or llmgate died, time between
                 SIGTERM and SIGKILL (default 10s)
  -v, --verbose  report waiting, acquisition and release on stderr

CMD's environment also has:
  LLMGATE_LOCK_KEY    the lock's name
  LLMGATE_LOCK_FENCE  fencing token (decimal): strictly increases with every
                      acquisition of the key; pass it to storage that must
                      reject writes from a holder that lost the lock
  LLMGATE_LOCK_TOKEN  this acquisition's owner token (32 hex characters)

Exit status:
  CMD's status   CMD ran; 128+N if it was killed by signal N
  75             the lock was not obtained within --wait, or was lost while
                 CMD ran (EX_TEMPFAIL: try again later)
  2              bad flags, missing CMD, or the store is unusable or unreachable
  126, 127       CMD could not be executed, or was not found (the lock is
                 never taken)
  128+N          interrupted by signal N while waiting for the lock

SIGINT, SIGTERM, SIGHUP and SIGQUIT received while waiting abandon the wait;
received while CMD runs, they are passed on to CMD's process group. In the
foreground of a terminal CMD shares llmgate's process group instead, so it
can read the terminal and gets Ctrl-C from it directly.

If llmgate dies while CMD runs, even by SIGKILL, a helper process
(llmgate __lock-reaper) sends CMD's process group SIGTERM, then SIGKILL
after --grace. Processes that leave the group (setsid, daemons) are not
stopped; in the foreground of a terminal only CMD gets SIGTERM (Linux).

Examples:
  # cron: run the report on one machine at a time; skip a run if the last
  # one is still going
  */5 * * * * LLMGATE_STORE=redis://redis.internal:6379 llmgate lock --key nightly-report -- /opt/report.sh

  # wait up to a minute for the previous deploy to finish
  llmgate lock --store redis://127.0.0.1:6379 --key deploy --ttl 30s --wait 1m -- ./deploy.sh prod
`

// reaperCommand is the hidden subcommand that runs llmgate lock's reaper
// (reaper.go). It is not listed in the help: only llmgate lock starts it.
const reaperCommand = "__lock-reaper"

// lockConfig is a parsed 'llmgate lock' command line.
type lockConfig struct {
	store   string
	key     string
	ttl     time.Duration
	wait    time.Duration
	grace   time.Duration
	fair    bool
	verbose bool
	argv    []string // CMD and its arguments
}

// durationFlag is a time.Duration flag with an error message a user can act on.
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a duration such as 500ms, 10s or 2m")
	}
	*f.d = d
	return nil
}

// errHelp means --help was asked for; it is not a failure.
var errHelp = errors.New("help requested")

// parseLockArgs parses args after 'lock'. getenv supplies LLMGATE_STORE.
// Its errors are single lines that name the flag at fault and never carry a
// password.
func parseLockArgs(args []string, getenv func(string) string) (lockConfig, error) {
	c := lockConfig{ttl: lock.DefaultTTL, grace: 10 * time.Second}
	fs := flag.NewFlagSet("llmgate lock", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&c.store, "store", "", "")
	fs.StringVar(&c.key, "key", "", "")
	fs.Var(durationFlag{&c.ttl}, "ttl", "")
	fs.Var(durationFlag{&c.wait}, "wait", "")
	fs.Var(durationFlag{&c.grace}, "grace", "")
	fs.BoolVar(&c.fair, "fair", false, "")
	fs.BoolVar(&c.verbose, "verbose", false, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, errHelp
		}
		return c, fmt.Errorf("%s; see 'llmgate lock --help'", twoDashes(err.Error()))
	}
	c.argv = fs.Args()
	storeFromEnv := false
	if c.store == "" {
		c.store = getenv("LLMGATE_STORE")
		storeFromEnv = c.store != ""
	}
	switch {
	case c.key == "":
		return c, errors.New("--key is required: the name of the lock")
	case c.store == "":
		return c, errors.New("--store is required (or set LLMGATE_STORE), e.g. --store redis://127.0.0.1:6379")
	case storeurl.IsMemory(c.store):
		if storeFromEnv {
			return c, errors.New("--store memory (from LLMGATE_STORE) cannot coordinate separate processes; use redis://host:port")
		}
		return c, errors.New("--store memory cannot coordinate separate processes; use redis://host:port")
	case c.ttl < lock.MinTTL:
		return c, fmt.Errorf("--ttl %v is below the minimum %v", c.ttl, lock.MinTTL)
	case c.wait < 0:
		return c, fmt.Errorf("--wait %v is negative; use 0 to try once", c.wait)
	case c.grace < 0:
		return c, fmt.Errorf("--grace %v is negative", c.grace)
	case len(c.argv) == 0:
		return c, errors.New("missing CMD: usage: llmgate lock --store URL --key NAME [flags] -- CMD [ARGS...]")
	}
	return c, nil
}

// twoDashes rewrites the flag package's "-name" in msg as "--name", the
// spelling the docs use.
func twoDashes(msg string) string {
	for _, p := range []string{"flag -", "defined: -", "argument: -", "for -"} {
		if i := strings.LastIndex(msg, p); i >= 0 {
			j := i + len(p) - 1
			return msg[:j] + "-" + msg[j:]
		}
	}
	return msg
}

// lock is 'llmgate lock'.
func (a *App) lock(args []string) int {
	c, err := parseLockArgs(args, a.Getenv)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.Stdout, lockUsageText)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate lock: %s\n", redactSecret(err.Error(), c.store))
		return exitUsage
	}
	return a.runLock(c)
}

// redactSecret removes the password of store URL s from msg. storeurl
// already keeps it out of its own errors; this is the last line of defence
// for every message llmgate lock prints.
func redactSecret(msg, s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		if i, j := strings.Index(s, "://"), strings.LastIndex(s, "@"); i >= 0 && j > i+3 {
			// Unparsable URL: hide the password, or a lone token.
			secret := s[i+3 : j]
			if k := strings.Index(secret, ":"); k >= 0 {
				secret = secret[k+1:]
			}
			if secret != "" {
				msg = strings.ReplaceAll(msg, secret, "xxxxx")
			}
		}
		return msg
	}
	if p, ok := u.User.Password(); ok && p != "" {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
		if e := url.PathEscape(p); e != p {
			msg = strings.ReplaceAll(msg, e, "xxxxx")
		}
	}
	return msg
}
