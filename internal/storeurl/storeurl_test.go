package storeurl

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/llmgate/llmgate/internal/testutil"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, secret, want string }{
		{"redis://:s3cret@127.0.0.1:6379/0", "s3cret", "redis://xxxxx@127.0.0.1:6379/0"},
		{"redis://user:s3cret@host:6379", "s3cret", "redis://xxxxx@host:6379"},
		{"redis://tok3n@host:6379", "tok3n", "redis://xxxxx@host:6379"},
		{"rediss://:p%40ss@host", "p@ss", "rediss://xxxxx@host"},
		{"redis://127.0.0.1:6379", "", "redis://127.0.0.1:6379"},
		{"::not a url:s3cret@x", "s3cret", ""},
		{"redis://s1:1?master_set=m&sentinel_password=s3cret&addr=s2:2", "s3cret", "redis://s1:1?master_set=m&sentinel_password=xxxxx&addr=s2:2"},
		{"redis://:d4ta@s1:1?sentinel_password=s3cret", "s3cret", "redis://xxxxx@s1:1?sentinel_password=xxxxx"},
		{"redis://s1:1?a=1;sentinel%5Fpassword=s3cret", "s3cret", "redis://s1:1?a=1;sentinel%5Fpassword=xxxxx"},
		{"::bad:d4ta@s1?sentinel_password=s3cret", "s3cret", "xxxxx@s1?sentinel_password=xxxxx"},
	} {
		got := Redact(tc.in)
		if tc.secret != "" && strings.Contains(got, tc.secret) {
			t.Errorf("Redact(%q) = %q leaks %q", tc.in, got, tc.secret)
		}
		if tc.want != "" && got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRedisOption(t *testing.T) {
	if _, err := RedisOption("memory"); !errors.Is(err, ErrMemory) {
		t.Errorf("memory: %v, want ErrMemory", err)
	}
	for _, bad := range []string{"", "http://x", "redis://:s3cret@[::1", "redis://host:notaport"} {
		_, err := RedisOption(bad)
		if !errors.Is(err, ErrBadURL) {
			t.Errorf("RedisOption(%q) = %v, want ErrBadURL", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("RedisOption(%q) error leaks the password: %v", bad, err)
		}
	}
	opt, err := RedisOption("redis://:pw@127.0.0.1:6390/2")
	if err != nil {
		t.Fatal(err)
	}
	if len(opt.InitAddress) != 1 || opt.InitAddress[0] != "127.0.0.1:6390" || opt.SelectDB != 2 || opt.Password != "pw" || !opt.DisableCache {
		t.Errorf("options = %+v", opt)
	}
}

func TestRedisOptionConnections(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want int // rueidis's PipelineMultiplex
	}{
		{"redis://127.0.0.1:6390", -1}, // DefaultConnections: one
		{"redis://127.0.0.1:6390?connections=1", -1},
		{"redis://127.0.0.1:6390/0?connections=2", 1},
		{"unix:///tmp/redis.sock?connections=4", 2},
		{"redis://127.0.0.1:6390?connections=256", 8},
	} {
		opt, err := RedisOption(tc.url)
		if err != nil || opt.PipelineMultiplex != tc.want {
			t.Errorf("RedisOption(%q): PipelineMultiplex %d, %v; want %d", tc.url, opt.PipelineMultiplex, err, tc.want)
		}
	}
	for _, bad := range []string{"0", "3", "512", "-2", "x", ""} {
		u := "redis://:s3cret@127.0.0.1:6390?connections=" + bad
		_, err := RedisOption(u)
		if !errors.Is(err, ErrBadURL) || !errors.Is(err, ErrBadConnections) || !strings.Contains(err.Error(), "power of two") {
			t.Errorf("connections=%q: %v, want ErrBadURL about a power of two", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("connections=%q: the error shows the password: %v", bad, err)
		}
	}
}

// TestOpenRedisConnections counts, on a real server, the connections a
// client opened by OpenRedis pipelines over: rueidis reads 0 as "its
// default" (two or four), so one connection takes a value of its own.
func TestOpenRedisConnections(t *testing.T) {
	r := testutil.StartRedis(t)
	check := r.Client(t)
	for _, tc := range []struct {
		query string
		want  int
	}{{"", 1}, {"&connections=4", 4}} {
		name := "probe" + strconv.Itoa(tc.want)
		c, err := OpenRedis(r.URL() + "?client_name=" + name + tc.query)
		if err != nil {
			t.Fatal(err)
		}
		// Concurrent commands: rueidis picks a connection at random for
		// each, and opens it on first use.
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Go(func() {
				for i := range 50 {
					key := "k" + strconv.Itoa(g) + ":" + strconv.Itoa(i)
					if err := c.Do(context.Background(), c.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		list, err := check.Do(context.Background(), check.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(list, " name="+name+" "); got != tc.want {
			t.Errorf("query %q: %d connections named %s, want %d:\n%s", tc.query, got, name, tc.want, list)
		}
		c.Close()
	}
}

func TestOpenRedisUnreachableNeverShowsThePassword(t *testing.T) {
	// Port 1 on loopback: nothing listens there.
	_, err := OpenRedis("redis://someone:s3cret@127.0.0.1:1")
	if err == nil {
		t.Fatal("connected to port 1")
	}
	if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "someone") {
		t.Errorf("error shows the credentials: %v", err)
	}
}

// FuzzRedact: whatever the input, a password or user part that url.Parse
// finds never appears in the redacted text, and nothing panics.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{"redis://:s3cret@h:1", "redis://u:p@h", "rediss://tok@h/0", "x@y", "redis://h", "%zz@", "",
		"redis://:s3cret@h1:1,h2:2?master_set=m", "redis://u:p4ss@h1,h2/0?addr=h3",
		"redis://h1:1?master_set=m&sentinel_password=s3cret", "redis://h?x=1;Sentinel_Pass%77ord=s3cret&y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Redact(s)
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		for _, p := range u.Query()["sentinel_password"] {
			if len(p) >= 4 && strings.Contains(got, p) && strings.Count(got, p) > strings.Count(Redact(strings.ReplaceAll(s, p, strings.Repeat("Z", len(p)))), p) {
				t.Fatalf("Redact(%q) = %q shows the sentinel password %q", s, got, p)
			}
		}
		if u.User == nil {
			return
		}
		if p, ok := u.User.Password(); ok && len(p) >= 4 && strings.Contains(got, p) && !strings.Contains(strings.ReplaceAll(s, p, ""), p) {
			t.Fatalf("Redact(%q) = %q shows the password %q", s, got, p)
		}
		if n := u.User.Username(); len(n) >= 4 && strings.Contains(got, n) && !strings.Contains(u.Host+u.Path+u.RawQuery+u.Fragment, n) {
			t.Fatalf("Redact(%q) = %q shows the user part %q", s, got, n)
		}
		_, _ = RedisOption(s)
	})
}
