package storeurl

import (
	"context"
	"errors"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// TestRedisOptionSeeds: comma-separated hosts and addr= parameters are all
// seeds, in order; master_set makes them sentinels.
func TestRedisOptionSeeds(t *testing.T) {
	for _, tc := range []struct {
		url       string
		addrs     []string
		masterSet string
	}{
		{"redis://h1:7001,h2:7002,h3:7003", []string{"h1:7001", "h2:7002", "h3:7003"}, ""},
		{"redis://h1:7001?addr=h2:7002&addr=h3:7003", []string{"h1:7001", "h2:7002", "h3:7003"}, ""},
		{"redis://h1:7001,h2:7002?addr=h3:7003", []string{"h1:7001", "h2:7002", "h3:7003"}, ""},
		{"redis://:pw@s1:26379,s2:26380,s3:26381/0?master_set=main", []string{"s1:26379", "s2:26380", "s3:26381"}, "main"},
		{"redis://[::1]:7001?addr=[::1]:7002", []string{"[::1]:7001", "[::1]:7002"}, ""},
		{"redis://s1:26379?addr=s2:26380&master_set=main&connections=2", []string{"s1:26379", "s2:26380"}, "main"},
	} {
		opt, err := RedisOption(tc.url)
		if err != nil {
			t.Errorf("RedisOption(%q): %v", tc.url, err)
			continue
		}
		if !slices.Equal(opt.InitAddress, tc.addrs) || opt.Sentinel.MasterSet != tc.masterSet || !opt.DisableCache {
			t.Errorf("RedisOption(%q): addresses %v, master set %q; want %v, %q", tc.url, opt.InitAddress, opt.Sentinel.MasterSet, tc.addrs, tc.masterSet)
		}
		if tc.masterSet != "" && opt.Sentinel.TopologyRefreshInterval != SentinelRefresh {
			t.Errorf("RedisOption(%q): sentinel refresh %v, want %v", tc.url, opt.Sentinel.TopologyRefreshInterval, SentinelRefresh)
		}
	}
	opt, err := RedisOption("redis://u:pw@s1:1,s2:2/3?master_set=m")
	if err != nil {
		t.Fatal(err)
	}
	// The credentials and database are the data nodes'; sentinels get none.
	if opt.Username != "u" || opt.Password != "pw" || opt.SelectDB != 3 || opt.Sentinel.Password != "" || opt.Sentinel.Username != "" {
		t.Errorf("options = %+v", opt)
	}
	// Unless the URL gives theirs.
	opt, err = RedisOption("redis://u:pw@s1:1,s2:2/3?master_set=m&sentinel_username=su&sentinel_password=s%26p")
	if err != nil {
		t.Fatal(err)
	}
	if opt.Username != "u" || opt.Password != "pw" || opt.Sentinel.Username != "su" || opt.Sentinel.Password != "s&p" {
		t.Errorf("options = %+v", opt)
	}
	for _, bad := range []string{
		"redis://:s3cret@h1:1,,h2:2",
		"redis://:s3cret@h1:1,h2:0",
		"redis://:s3cret@h1:1,h2:99999",
		"redis://:s3cret@h1:1,:5",
		"redis://:s3cret@h1:1,h2:x1?master_set=m",
		"redis://:s3cret@h1,h2:1:2",
		"redis://:s3cret@h1:1,h2:2,h3/0",
		"redis://:s3cret@h1:1?addr=h2",
		"redis://:s3cret@h1:1?addr=h2:0&master_set=m",
		"redis://:s3cret@h1?addr=",
		"redis://h1:1?sentinel_password=s3cret",
		"redis://h1:1,h2:2?sentinel_username=u&sentinel_password=s3cret",
	} {
		_, err := RedisOption(bad)
		if !errors.Is(err, ErrBadURL) {
			t.Errorf("RedisOption(%q) = %v, want ErrBadURL", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("RedisOption(%q) error leaks the password: %v", bad, err)
		}
	}
}

// TestOpenRedisSentinel: a Sentinel URL in either form reaches the master
// through the sentinels.
func TestOpenRedisSentinel(t *testing.T) {
	s := testutil.SharedSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	a := s.SentinelAddrs()
	for _, u := range []string{
		"redis://" + strings.Join(a, ",") + "?master_set=" + testutil.MasterSet,
		s.URL(),
	} {
		c, err := OpenRedis(u)
		if err != nil {
			t.Fatalf("OpenRedis(%q): %v", u, err)
		}
		if c.Mode() != rueidis.ClientModeSentinel {
			t.Errorf("OpenRedis(%q): mode %v, want sentinel", u, c.Mode())
		}
		if err := c.Do(ctx, c.B().Set().Key("storeurl:s").Value("1").Build()).Error(); err != nil {
			t.Errorf("SET through %q: %v", u, err)
		}
		c.Close()
	}
	masterHolds(t, ctx, s, "storeurl:s", "1")
	// A master set the sentinels do not know: an error without the password.
	_, err := OpenRedis("redis://:s3cret@" + strings.Join(a, ",") + "?master_set=nosuch")
	if err == nil {
		t.Fatal("connected to an unknown master set")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error shows the password: %v", err)
	}
}

// TestOpenRedisSentinelAuth: with sentinels and data nodes that each
// require their own password, the URL's user part reaches the data nodes
// and sentinel_password the sentinels; without the latter, or with a
// wrong one, the error shows neither password.
func TestOpenRedisSentinelAuth(t *testing.T) {
	auth := testutil.SentinelAuth{Data: "d@ta:pw/1", Sentinels: "s&nt=pw#2"}
	s := testutil.StartSentinelAuth(t, auth)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := OpenRedis(s.URL())
	if err != nil {
		t.Fatalf("OpenRedis(%s): %v", Redact(s.URL()), err)
	}
	if err := c.Do(ctx, c.B().Set().Key("storeurl:auth").Value("1").Build()).Error(); err != nil {
		t.Errorf("SET through the sentinels: %v", err)
	}
	c.Close()
	masterHolds(t, ctx, s, "storeurl:auth", "1")
	for name, u := range map[string]string{
		"no sentinel password":    strings.Replace(s.URL(), "&sentinel_password="+url.QueryEscape(auth.Sentinels), "", 1),
		"wrong sentinel password": strings.Replace(s.URL(), "&sentinel_password=", "&sentinel_password=x", 1),
		"wrong data password":     strings.Replace(s.URL(), "redis://:", "redis://:x", 1),
	} {
		c, err := OpenRedis(u)
		if err == nil {
			// rueidis may connect to the sentinels and fail on the master.
			err = c.Do(ctx, c.B().Set().Key("storeurl:auth").Value("2").Build()).Error()
			c.Close()
		}
		if err == nil {
			t.Errorf("%s: connected and wrote", name)
			continue
		}
		for _, p := range []string{auth.Data, auth.Sentinels, url.QueryEscape(auth.Sentinels)} {
			if strings.Contains(err.Error(), p) {
				t.Errorf("%s: the error shows a password: %v", name, err)
			}
		}
	}
}

// masterHolds checks that the master the sentinels name holds want under
// key, written through them.
func masterHolds(t *testing.T, ctx context.Context, s *testutil.Sentinel, key, want string) {
	t.Helper()
	m, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Command(ctx, "GET", key); err != nil {
		t.Fatal(err)
	} else if got, _ := v.ToString(); got != want {
		t.Errorf("the master holds %q, want the value written through the sentinels", got)
	}
}

// TestOpenRedisClusterSeeds: a Cluster URL with several seeds opens a
// Cluster client, even when the first seed is down.
func TestOpenRedisClusterSeeds(t *testing.T) {
	c := testutil.SharedCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Port 1 on loopback: nothing listens there.
	u := "redis://127.0.0.1:1," + strings.Join(c.Addrs(), ",")
	cl, err := OpenRedis(u)
	if err != nil {
		t.Fatalf("OpenRedis(%q): %v", u, err)
	}
	defer cl.Close()
	if cl.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("mode %v, want cluster", cl.Mode())
	}
	for _, k := range []string{"{a}", "{b}", "{c}"} {
		if err := cl.Do(ctx, cl.B().Set().Key(k).Value("1").Build()).Error(); err != nil {
			t.Errorf("SET %s: %v", k, err)
		}
	}
}

// FuzzRedisOption: whatever the input, RedisOption does not panic and its
// error never shows a password or user part that url.Parse finds.
func FuzzRedisOption(f *testing.F) {
	for _, s := range []string{
		"redis://:s3cret@h1:1,h2:2", "redis://u:p4ss@s1:1,s2:2/0?master_set=m", "redis://h?addr=h2:2&addr=h3",
		"redis://:s3cret@h1:1,,h2", "redis://:s3cret@h1:1,h2:99999", "rediss://a,b,c?master_set=x&connections=4",
		"redis://[::1]:1,h", "unix:///tmp/x.sock",
		"redis://:d4ta@s1:1,s2:2?master_set=m&sentinel_password=s3cret", "redis://h:1?sentinel_password=s3cret&connections=3",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := RedisOption(s)
		if err == nil {
			return
		}
		u, perr := url.Parse(s)
		if perr != nil {
			return
		}
		msg := err.Error()
		for _, p := range u.Query()["sentinel_password"] {
			if len(p) >= 4 && strings.Contains(msg, p) {
				_, other := RedisOption(strings.ReplaceAll(s, p, strings.Repeat("Z", len(p))))
				if other == nil || strings.Count(msg, p) > strings.Count(other.Error(), p) {
					t.Fatalf("RedisOption(%q) error %q shows the sentinel password %q", s, msg, p)
				}
			}
		}
		if u.User == nil {
			return
		}
		if p, ok := u.User.Password(); ok && len(p) >= 4 && strings.Contains(msg, p) && !strings.Contains(strings.ReplaceAll(s, p, ""), p) {
			// The message's own words may hold it ("pass" in "password"):
			// a leak is one more occurrence than the same URL with
			// another password of the same length gets.
			_, other := RedisOption(strings.ReplaceAll(s, p, strings.Repeat("Z", len(p))))
			if other == nil || strings.Count(msg, p) > strings.Count(other.Error(), p) {
				t.Fatalf("RedisOption(%q) error %q shows the password %q", s, msg, p)
			}
		}
		if n := u.User.Username(); len(n) >= 4 && strings.Contains(msg, n) && !strings.Contains(u.Host+u.Path+u.RawQuery+u.Fragment, n) {
			// The same test as for the password: "pass" is in "password".
			_, other := RedisOption(strings.ReplaceAll(s, n, strings.Repeat("Z", len(n))))
			if other == nil || strings.Count(msg, n) > strings.Count(other.Error(), n) {
				t.Fatalf("RedisOption(%q) error %q shows the user part %q", s, msg, n)
			}
		}
	})
}
