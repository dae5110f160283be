// Package testutil starts real redis-server processes on free loopback ports for tests and benchmarks.
package testutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// Redis is a redis-server child process listening on 127.0.0.1.
type Redis struct {
	Addr string // host:port
	Port int
	dir  string
	conf string   // config file given before every argument, or "" (sentinels need one)
	args []string // extra redis-server arguments, after the defaults
	// password is the server's requirepass (from args), which Command and
	// Client authenticate with; "" for none.
	password string

	mu     sync.Mutex // protects cmd and exited
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
}

// RedisServerPath returns the redis-server binary to use: $REDIS_SERVER, or
// redis-server from PATH (or /usr/bin, /usr/sbin, /usr/local/bin).
func RedisServerPath() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("redis-server not found: install it (apt-get install redis-server) or run ./scripts/test.sh, which does")
}

// StartRedis starts a redis-server without persistence on a free loopback
// port and stops it when the test ends. The test fails if redis-server is
// missing: tests that claim Redis behaviour must not silently skip.
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	r, err := NewRedis(tb.TempDir())
	if err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	tb.Cleanup(r.Stop)
	return r
}

// StartRedisArgs is StartRedis with extra redis-server arguments, which
// override the defaults: for example "--appendonly", "yes",
// "--appendfsync", "always" for a server whose data survives Restart.
// With "--requirepass", P, Client and Command authenticate with P.
func StartRedisArgs(tb testing.TB, args ...string) *Redis {
	tb.Helper()
	r, err := NewRedisArgs(tb.TempDir(), args...)
	if err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	tb.Cleanup(r.Stop)
	return r
}

// NewRedis starts a redis-server with its working directory in dir. The
// caller must call Stop.
func NewRedis(dir string) (*Redis, error) { return NewRedisArgs(dir) }

// NewRedisArgs is NewRedis with extra redis-server arguments (see
// StartRedisArgs); every Start and Restart uses them.
func NewRedisArgs(dir string, args ...string) (*Redis, error) { return newRedis(dir, "", args...) }

// newRedis is NewRedisArgs with a config file (or "").
func newRedis(dir, conf string, args ...string) (*Redis, error) {
	// A free port can be taken by another process before the server binds
	// it (test packages run in parallel): then try another.
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r := &Redis{Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, conf: conf, args: args}
		for i, a := range args[:max(len(args)-1, 0)] {
			if a == "--requirepass" {
				r.password = args[i+1]
			}
		}
		err = r.Start()
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, errExited) || attempt == 5 {
			return nil, err
		}
	}
}

// URL returns redis://Addr.
func (r *Redis) URL() string { return "redis://" + r.Addr }

// Start (re)starts the server on its port and waits until it answers PING.
func (r *Redis) Start() error {
	bin, err := RedisServerPath()
	if err != nil {
		return err
	}
	args := []string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(r.Port),
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
		"--logfile", filepath.Join(r.dir, "redis.log"),
	}
	if r.conf != "" {
		args = append([]string{r.conf}, args...)
	}
	cmd := exec.Command(bin, append(args, r.args...)...)
	// A group of its own, so that Stop kills the children it forks for a
	// background save or AOF rewrite too: one outliving it would write
	// into a directory the test is removing.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	// A generous bound: on a loaded machine a fork and exec can take
	// seconds. A server that exits (its port was taken meanwhile) is
	// reported at once.
	deadline := time.Now().Add(startTimeout)
	for {
		err := ping(r.Addr)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			r.Stop()
			return fmt.Errorf("%w on %s: %s", errExited, r.Addr, r.logTail())
		default:
		}
		if time.Now().After(deadline) {
			r.Stop()
			return fmt.Errorf("redis-server on %s did not answer PING within %v: %w", r.Addr, startTimeout, err)
		}
		time.Sleep(5 * time.Millisecond) // waiting for an external process: nothing to select on
	}
}

// startTimeout bounds how long a redis-server may take to answer its first
// PING.
const startTimeout = time.Minute

// errExited is a redis-server that exited before it answered.
var errExited = errors.New("redis-server exited at start")

// logTail returns the end of the server's log file.
func (r *Redis) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	if len(b) > 1000 {
		b = b[len(b)-1000:]
	}
	return strings.TrimSpace(string(b))
}

// Stop kills the server and any child it forked (SIGKILL: no chance to
// save anything) and waits for it.
func (r *Redis) Stop() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Restart kills the server and starts it again on the same port. The data
// is lost, unless the server was started with persistence arguments (see
// StartRedisArgs), in which case it reloads what reached its disk.
func (r *Redis) Restart() error {
	r.Stop()
	return r.Start()
}

// Client returns a rueidis client for the server, closed when the test ends.
func (r *Redis) Client(tb testing.TB) rueidis.Client {
	tb.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true, Password: r.password})
	if err != nil {
		tb.Fatalf("connect to redis %s: %v", r.Addr, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Do sends one command on a fresh connection and returns the raw first reply
// line; handy for out-of-band interference (DEL from outside) in tests.
func (r *Redis) Do(ctx context.Context, args ...string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", r.Addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	// A server started with --requirepass answers NOAUTH: it is up.
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("unexpected reply %q", line)
	}
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartCluster starts a one-node Redis Cluster holding every slot and waits
// until it reports itself up. The node refuses (CROSSSLOT) any script whose
// keys hash to different slots, which is what Cluster-safety tests need.
func StartCluster(tb testing.TB) *Redis {
	tb.Helper()
	var r *Redis
	for attempt := 1; r == nil; attempt++ {
		busPort, err := FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		// A taken bus port, like a taken client port, makes it exit: try
		// other ports.
		r, err = NewRedisArgs(tb.TempDir(), "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(busPort))
		if err != nil && (!errors.Is(err, errExited) || attempt == 5) {
			tb.Fatalf("start redis-server: %v", err)
		}
	}
	tb.Cleanup(r.Stop)
	ctx := context.Background()
	if line, err := r.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil || line != "+OK" {
		tb.Fatalf("CLUSTER ADDSLOTSRANGE: %q, %v", line, err)
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if info, err := r.clusterInfo(ctx); err == nil && strings.Contains(info, "cluster_state:ok") {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("cluster on %s not ok after %v", r.Addr, startTimeout)
		}
		time.Sleep(10 * time.Millisecond) // an external process: nothing to wait on
	}
}

// clusterInfo returns CLUSTER INFO's text.
func (r *Redis) clusterInfo(ctx context.Context) (string, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.Do(ctx, c.B().ClusterInfo().Build()).ToString()
}

// Int sends one command on a fresh connection and parses its integer reply,
// failing the test otherwise.
func (r *Redis) Int(tb testing.TB, args ...string) int64 {
	tb.Helper()
	line, err := r.Do(context.Background(), args...)
	if err != nil {
		tb.Fatalf("%v: %v", args, err)
	}
	if !strings.HasPrefix(line, ":") {
		tb.Fatalf("%v: reply %q, want an integer", args, line)
	}
	n, err := strconv.ParseInt(line[1:], 10, 64)
	if err != nil {
		tb.Fatalf("%v: reply %q: %v", args, line, err)
	}
	return n
}
