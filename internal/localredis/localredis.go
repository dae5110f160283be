// Package localredis starts a throw-away redis-server child process on a free loopback port, for commands (llmgate bench, llmgate sim) that need a Redis store when none is given.
package localredis

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
	"syscall"
	"time"
)

// startTimeout bounds the wait for a started redis-server to answer.
const startTimeout = 10 * time.Second

// Errors returned by this package.
var (
	// ErrNotFound means no redis-server binary was found.
	ErrNotFound = errors.New("redis-server not found")
	// ErrStart wraps failures to start a redis-server or to reach it.
	ErrStart = errors.New("cannot start redis-server")
)

// Server is a throw-away redis-server child process on a free loopback
// port, without persistence.
type Server struct {
	// URL is redis://127.0.0.1:PORT.
	URL  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed when the process has exited
}

// Path returns $REDIS_SERVER, or redis-server from PATH. The error says
// how to install it; callers add how to name an existing store instead.
func Path() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w on PATH: install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or set $REDIS_SERVER", ErrNotFound)
	}
	return p, nil
}

// Start starts bin on a free loopback port and waits until it answers
// PING. The caller must call Stop.
func Start(ctx context.Context, bin string) (_ *Server, err error) {
	dir, err := os.MkdirTemp("", "llmgate-redis-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: no free loopback port: %w", ErrStart, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning",
		"--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", ErrStart, bin, err)
	}
	r := &Server{URL: "redis://" + addr, cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.done)
	}()
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	for {
		perr := Ping(ctx, addr)
		if perr == nil {
			return r, nil
		}
		// An external process: nothing to wait on but its port.
		retry := time.NewTimer(10 * time.Millisecond)
		select {
		case <-r.done:
			retry.Stop()
			return nil, fmt.Errorf("%w: redis-server exited at start; see %s", ErrStart, filepath.Join(dir, "redis.log"))
		case <-deadline.C:
			retry.Stop()
			r.Stop()
			return nil, fmt.Errorf("%w: redis-server on %s did not answer PING within %v: %w", ErrStart, addr, startTimeout, perr)
		case <-ctx.Done():
			retry.Stop()
			r.Stop()
			return nil, errors.Join(fmt.Errorf("%w: start cancelled", ErrStart), ctx.Err())
		case <-retry.C:
		}
	}
}

// Dir is the server's working directory (its log is redis.log there).
func (r *Server) Dir() string { return r.dir }

// Stop kills the server (nothing of it is worth saving) and removes its
// directory.
func (r *Server) Stop() {
	_ = r.cmd.Process.Kill()
	<-r.done
	_ = os.RemoveAll(r.dir)
}

// Ping sends PING to addr (host:port) and expects PONG.
func Ping(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
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
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("unexpected reply %q", strings.TrimSpace(line))
	}
	return nil
}
