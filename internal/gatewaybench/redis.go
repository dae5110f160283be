package gatewaybench

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

// redisStartTimeout bounds the wait for a started redis-server to answer.
const redisStartTimeout = 10 * time.Second

// ErrNoRedisServer means the redis variant was asked for without --redis
// and no redis-server binary was found.
var ErrNoRedisServer = errors.New("gatewaybench: redis-server not found")

// localRedis is a throw-away redis-server child process on a free
// loopback port, without persistence.
type localRedis struct {
	URL  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed when the process has exited
}

// redisServerPath returns $REDIS_SERVER, or redis-server from PATH.
func redisServerPath() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w on PATH: install it (apt-get install redis-server), set $REDIS_SERVER, or give --redis ADDR", ErrNoRedisServer)
	}
	return p, nil
}

// startRedis starts bin on a free loopback port and waits until it answers
// PING. The caller must call stop.
func startRedis(ctx context.Context, bin string) (_ *localRedis, err error) {
	dir, err := os.MkdirTemp("", "llmgate-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("%w: no free loopback port: %w", ErrSetup, err)
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
		return nil, fmt.Errorf("%w: start %s: %w", ErrSetup, bin, err)
	}
	r := &localRedis{URL: "redis://" + addr, cmd: cmd, dir: dir, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(r.done)
	}()
	deadline := time.NewTimer(redisStartTimeout)
	defer deadline.Stop()
	for {
		perr := ping(ctx, addr)
		if perr == nil {
			return r, nil
		}
		// An external process: nothing to wait on but its port.
		retry := time.NewTimer(10 * time.Millisecond)
		select {
		case <-r.done:
			retry.Stop()
			return nil, fmt.Errorf("%w: redis-server exited at start; see %s", ErrSetup, filepath.Join(dir, "redis.log"))
		case <-deadline.C:
			retry.Stop()
			r.stop()
			return nil, fmt.Errorf("%w: redis-server on %s did not answer PING within %v: %w", ErrSetup, addr, redisStartTimeout, perr)
		case <-ctx.Done():
			retry.Stop()
			r.stop()
			return nil, errors.Join(fmt.Errorf("%w: redis-server start cancelled", ErrSetup), ctx.Err())
		case <-retry.C:
		}
	}
}

// stop kills the server (nothing of it is worth saving) and removes its
// directory.
func (r *localRedis) stop() {
	_ = r.cmd.Process.Kill()
	<-r.done
	_ = os.RemoveAll(r.dir)
}

func ping(ctx context.Context, addr string) error {
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
