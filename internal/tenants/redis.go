package tenants

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// Keys, all in one hash slot (cluster):
//
//	<prefix>{tenants}:t  hash: tenant name -> record (JSON)
//	<prefix>{tenants}:k  hash: key hash -> tenant name
//	<prefix>{tenants}:v  string: the registry's version

// DefaultPrefix starts every key the Redis store writes.
const DefaultPrefix = "llmgate:"

var (
	//go:embed apply.lua
	applySrc    string
	applyScript = rueidis.NewLuaScript(applySrc)
	//go:embed load.lua
	loadSrc    string
	loadScript = rueidis.NewLuaScript(loadSrc)
)

// Redis is the store shared by replicas.
type Redis struct {
	c    rueidis.Client
	keys []string
}

var _ Store = (*Redis)(nil)

// NewRedis returns the store on c; prefix "" means DefaultPrefix.
func NewRedis(c rueidis.Client, prefix string) *Redis {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	p := prefix + "{tenants}:"
	return &Redis{c: c, keys: []string{p + "t", p + "k", p + "v"}}
}

// Version implements Store.
func (r *Redis) Version(ctx context.Context) (int64, error) {
	v, err := r.c.Do(ctx, r.c.B().Get().Key(r.keys[2]).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tenants: version: %w", err)
	}
	return v, nil
}

// Load implements Store.
func (r *Redis) Load(ctx context.Context) (int64, map[string][]byte, error) {
	res, err := loadScript.Exec(ctx, r.c, r.keys, nil).ToArray()
	if err != nil {
		return 0, nil, fmt.Errorf("tenants: load: %w", err)
	}
	if len(res) != 2 {
		return 0, nil, fmt.Errorf("tenants: load: %d values in the answer", len(res))
	}
	vs, err := res[0].ToString()
	if err != nil {
		return 0, nil, fmt.Errorf("tenants: load: %w", err)
	}
	v, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("tenants: load: version %q", vs)
	}
	kv, err := res[1].ToArray()
	if err != nil {
		return 0, nil, fmt.Errorf("tenants: load: %w", err)
	}
	out := make(map[string][]byte, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		name, err1 := kv[i].ToString()
		rec, err2 := kv[i+1].ToString()
		if err1 != nil || err2 != nil {
			return 0, nil, fmt.Errorf("tenants: load: a record is not a string")
		}
		out[name] = []byte(rec)
	}
	return v, out, nil
}

// Apply implements Store.
func (r *Redis) Apply(ctx context.Context, c Change) (int64, error) {
	args := make([]string, 0, 4+len(c.Add)+len(c.Drop))
	args = append(args, c.Name, string(c.Old), string(c.New), strconv.Itoa(len(c.Add)))
	args = append(args, c.Add...)
	args = append(args, c.Drop...)
	res, err := applyScript.Exec(ctx, r.c, r.keys, args).ToArray()
	if err != nil {
		return 0, fmt.Errorf("tenants: apply: %w", err)
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("tenants: apply: %d values in the answer", len(res))
	}
	v, err := res[0].AsInt64()
	if err != nil {
		return 0, fmt.Errorf("tenants: apply: %w", err)
	}
	switch v {
	case -1:
		return 0, ErrConflict
	case -2:
		return 0, ErrKeyTaken
	}
	return v, nil
}
