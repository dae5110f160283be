package config

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	shaTest  = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" // sha256("test")
	shaOther = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752" // sha256("test2")
)

func TestValidateProblems(t *testing.T) {
	const P = providerBlock
	const T = P + `
tenants:
  - name: acme
    api_key_sha256: ` + shaTest + `
`
	notEnv := `is not an environment variable name (letters, digits and _, not starting with a digit); write the variable's name, not its value`
	cases := []struct {
		name string
		yaml string
		env  map[string]string
		want []string
	}{
		// Top level.
		{"listen not host:port", P + "listen: localhost", nil,
			[]string{`listen: "localhost" is not host:port; write it like 127.0.0.1:8080, or :8080 for every interface`}},
		{"listen named port", P + "listen: 127.0.0.1:http", nil,
			[]string{`listen: port "http" is not a number from 0 to 65535`}},
		{"listen port too large", P + "listen: 127.0.0.1:70000", nil,
			[]string{`listen: port "70000" is not a number from 0 to 65535`}},
		{"open access on every interface", P + `listen: ":8080"`, nil,
			[]string{`tenants: none, and listen ":8080" is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1`}},
		{"open access on a public address", P + "listen: 0.0.0.0:8080", nil,
			[]string{`tenants: none, and listen "0.0.0.0:8080" is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1`}},
		{"open access on a host name", P + "listen: gateway.internal:8080", nil,
			[]string{`tenants: none, and listen "gateway.internal:8080" is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1`}},
		{"bad store, password redacted", P + "store: http://user:hunter2@example.com", nil,
			[]string{`store: "http://xxxxx@example.com" is neither memory nor a redis URL; write it like redis://[user:password@]host:6379[/db], rediss://... (TLS) or unix:///path/to/redis.sock`}},
		{"store connections not a power of two, password redacted", P + `store: "redis://:hunter2@127.0.0.1:6379?connections=3"`, nil,
			[]string{`store: "redis://xxxxx@127.0.0.1:6379?connections=3": connections must be a power of two from 1 to 256`}},
		{"state dir with ~", P + "state_dir: ~/state", nil,
			[]string{`state_dir: "~/state" starts with ~, which is not expanded here; write the full path`}},
		{"admin token env", P + "admin_token_env: 1TOKEN", nil,
			[]string{`admin_token_env: ` + notEnv}},
		{"negative max wait", P + "max_wait: -1s", nil,
			[]string{`max_wait: is -1s; must be >= 0 (0 = answer 429 at once instead of waiting)`}},
		{"unknown http server", P + "http_server: fasthttp", nil,
			[]string{`http_server: "fasthttp" is not a server; net/http is the only one (delete the setting)`}},
		{"removed lean server", P + "http_server: lean", nil,
			[]string{`http_server: lean, llmgate's own HTTP/1.1 server, was removed: net/http's serves every request now; delete the setting`}},
		{"tls half set", P + "server: {tls_cert_file: a.pem}", nil,
			[]string{`server.tls_cert_file: and server.tls_key_file go together: set both for HTTPS, or neither`}},
		{"tls files missing", P + "server: {tls_cert_file: /nonexistent/a.pem, tls_key_file: /nonexistent/a.key}", nil,
			[]string{`server.tls_cert_file: cannot be loaded with its key: open /nonexistent/a.pem: no such file or directory`}},
		{"negative server bounds", P + "server: {body_timeout: -1s, max_connections: -1}", nil,
			[]string{`server.body_timeout: is -1s; must be > 0, e.g. 60s`, `server.max_connections: is -1; must be > 0, e.g. 4096`}},
		{"shutdown waits out of range", P + "server: {drain_delay: -1s, shutdown_grace: 2h}", nil,
			[]string{`server.drain_delay: is -1s; use 0 (close the listener at once) to 5m, e.g. 5s`,
				`server.shutdown_grace: is 2h; use 0 (cut requests in flight at once) to 1h, e.g. 30s`}},
		{"tiny header cap", P + "upstream: {max_response_header_bytes: 100}", nil,
			[]string{`upstream.max_response_header_bytes: is 100 bytes; use 4KiB to 1GiB, e.g. 10MiB`}},
		{"negative request timeout", P + "request_timeout: -1s", nil,
			[]string{`request_timeout: is -1s; must be > 0, e.g. 10m`}},
		{"log level", P + "log: {level: verbose}", nil,
			[]string{`log.level: "verbose" is not a level; use debug, info, warn or error`}},
		{"log format", P + "log: {format: xml}", nil,
			[]string{`log.format: "xml" is not a format; use text or json`}},
		{"local window too short", P + "ratelimit: {local_window: 1ms}", nil,
			[]string{`ratelimit.local_window: is 1ms; must be between 10ms and 10s, e.g. 100ms`}},
		{"local window too long", P + "ratelimit: {local_window: 1m}", nil,
			[]string{`ratelimit.local_window: is 1m; must be between 10ms and 10s, e.g. 100ms`}},
		{"negative slow start", P + "ratelimit: {slow_start: -1}", nil,
			[]string{`ratelimit.slow_start: is -1; must be between 0 (off) and 1000, e.g. 4`}},
		{"negative reservation ttl", P + "budget: {reservation_ttl: -1m}", nil,
			[]string{`budget.reservation_ttl: is -1m; must be at least 1s (running requests renew their holds every third of it), e.g. 30s`}},
		{"reservation ttl too short", P + "budget: {reservation_ttl: 500ms}", nil,
			[]string{`budget.reservation_ttl: is 500ms; must be at least 1s (running requests renew their holds every third of it), e.g. 30s`}},
		{"negative ack replicas", P + "store: redis://127.0.0.1:6379\nbudget: {ack_replicas: -1}", nil,
			[]string{`budget.ack_replicas: is -1; must be >= 0 (0: do not wait for replicas)`}},
		{"ack replicas on memory", P + "store: memory\nbudget: {ack_replicas: 2}", nil,
			[]string{`budget.ack_replicas: is 2, but the memory store has no replicas; use a redis store or remove it`}},

		// Upstream.
		{"too many attempts", P + "upstream: {max_attempts: 11}", nil,
			[]string{`upstream.max_attempts: is 11; must be from 1 (no retry) to 10`}},
		{"negative attempts", P + "upstream: {max_attempts: -1}", nil,
			[]string{`upstream.max_attempts: is -1; must be from 1 (no retry) to 10`}},
		{"negative backoff", P + "upstream: {backoff_base: -1s}", nil,
			[]string{`upstream.backoff_base: is -1s; must be > 0, e.g. 200ms`}},
		{"backoff max below base", P + "upstream: {backoff_max: 100ms}", nil,
			[]string{`upstream.backoff_max: 100ms is less than upstream.backoff_base 200ms; raise it`}},
		{"breaker failures", P + "upstream: {breaker: {failures: -1}}", nil,
			[]string{`upstream.breaker.failures: is -1; must be >= 1 (consecutive failures that open the breaker)`}},
		{"breaker open for", P + "upstream: {breaker: {open_for: -1s}}", nil,
			[]string{`upstream.breaker.open_for: is -1s; must be > 0, e.g. 30s`}},
		{"timeout floor", P + "upstream: {timeout: {floor: -1s}}", nil,
			[]string{`upstream.timeout.floor: is -1s; must be > 0, e.g. 10s`}},
		{"timeout ceiling below floor", P + "upstream: {timeout: {ceiling: 5s}}", nil,
			[]string{`upstream.timeout.ceiling: 5s is less than upstream.timeout.floor 10s; raise it`}},
		{"timeout multiplier too large", P + "upstream: {timeout: {multiplier: 101}}", nil,
			[]string{`upstream.timeout.multiplier: is 101; must be a number above 0 and at most 100, e.g. 4`}},
		{"timeout multiplier NaN", P + "upstream: {timeout: {multiplier: .nan}}", nil,
			[]string{`upstream.timeout.multiplier: is NaN; must be a number above 0 and at most 100, e.g. 4`}},
		{"idle timeout", P + "upstream: {idle_timeout: -1s}", nil,
			[]string{`upstream.idle_timeout: is -1s; must be > 0, e.g. 2m`}},

		// Providers.
		{"no provider", "listen: 127.0.0.1:8080", nil,
			[]string{`providers: none; add at least one (docs/config.md), or start without a configuration file for the built-in default`}},
		{"provider without name", "providers: [{base_url: 'https://x/v1', models: [m]}]", nil,
			[]string{`providers[0].name: required: a short name such as openai, used in targets (openai/gpt-4o), limits and metrics`}},
		{"provider name in capitals", "providers: [{name: OpenAI, base_url: 'https://x/v1', models: [m]}]", nil,
			[]string{`providers[0].name: "OpenAI": use 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit`}},
		{"provider name with a slash", "providers: [{name: a/b, base_url: 'https://x/v1', models: [m]}]", nil,
			[]string{`providers[0].name: "a/b": use 1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit`}},
		{"provider name twice", P + "  - {name: openai, base_url: 'https://x/v1', models: [m]}", nil,
			[]string{`providers[1].name: "openai" is already the name of providers[0]; names must be unique`}},
		{"provider type", "providers: [{name: a, type: bedrock, base_url: 'https://x/v1', models: [m]}]", nil,
			[]string{`providers[0].type: "bedrock" is not a provider type; use openai (any OpenAI-compatible API), anthropic, azure (Azure OpenAI) or simulated (the built-in simulator)`}},
		{"azure needs api_version", "providers: [{name: a, type: azure, base_url: 'https://x.openai.azure.com', models: [m]}]", nil,
			[]string{`providers[0].api_version: required for type azure: the api-version of your Azure OpenAI resource, e.g. 2024-10-21`}},
		{"azure deployments", "providers: [{name: a, type: azure, api_version: '2024-10-21', base_url: 'https://x.openai.azure.com', models: [m], deployments: {m: 'a/b', n: x}}]", nil,
			[]string{`providers[0].deployments.m: "a/b" is not an Azure deployment name`, `providers[0].deployments.n: "n" is not in providers[0].models; add it there or remove this entry`}},
		{"passthrough", "providers: [{name: a, base_url: 'https://x/v1', models: [m]}, {name: c, type: anthropic, models: [n]}]\npassthrough: {provider: c, unknown_routes: maybe}", nil,
			[]string{`passthrough.unknown_routes: "maybe": use not_found (a 404 in OpenAI's shape) or pass (to passthrough.provider)`,
				`passthrough.provider: "c" is of type anthropic; routes without a model go to a provider of type openai or simulated`}},
		{"api_version for openai", "providers: [{name: a, base_url: 'https://x/v1', api_version: v1, models: [m]}]", nil,
			[]string{`providers[0].api_version: only for types anthropic and azure; remove it`}},
		{"base url missing", "providers: [{name: a, models: [m]}]", nil,
			[]string{`providers[0].base_url: required for type openai: the API's base URL, e.g. https://api.openai.com/v1`}},
		{"base url scheme", "providers: [{name: a, base_url: 'ftp://x', models: [m]}]", nil,
			[]string{`providers[0].base_url: "ftp://x" is not an http:// or https:// URL; write it like https://api.openai.com/v1`}},
		{"base url without host", "providers: [{name: a, base_url: 'https:///v1', models: [m]}]", nil,
			[]string{`providers[0].base_url: "https:///v1" is not an http:// or https:// URL; write it like https://api.openai.com/v1`}},
		{"base url with password", "providers: [{name: a, base_url: 'https://u:pw@x/v1', models: [m]}]", nil,
			[]string{`providers[0].base_url: holds a user name or password; remove it and give the key with api_key_env, api_key_envs or api_key_file`}},
		{"base url with query", "providers: [{name: a, base_url: 'https://x/v1?api-version=1', models: [m]}]", nil,
			[]string{`providers[0].base_url: has a query or fragment; give only the scheme, host and path, e.g. https://api.openai.com/v1`}},
		{"simulated settings on openai", "providers: [{name: a, base_url: 'https://x/v1', models: [m], simulated: {rpm: 1}}]", nil,
			[]string{`providers[0].simulated: only for type simulated; remove it, or set type: simulated`}},
		{"base url on simulated", "providers: [{name: s, type: simulated, base_url: 'https://x/v1', models: [m]}]", nil,
			[]string{`providers[0].base_url: not used by type simulated, which runs inside the gateway; remove it`}},
		{"simulated values", "providers: [{name: s, type: simulated, models: [m], simulated: {rpm: -1, ttft: -1s, error_rate: 1.5}}]", nil,
			[]string{
				`providers[0].simulated.rpm: is -1; must be >= 0 (0 = no limit)`,
				`providers[0].simulated.ttft: is -1s; must be >= 0`,
				`providers[0].simulated.error_rate: is 1.5; must be a fraction from 0 to 1 (0.05 = 5%)`,
			}},
		{"two key sources", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_env: K, api_key_file: /k}]", nil,
			[]string{`providers[0]: set only one of api_key_env, api_key_envs and api_key_file`}},
		{"key env name", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_env: bad-name}]", nil,
			[]string{`providers[0].api_key_env: ` + notEnv}},
		{"key pasted instead of a variable name", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_env: sk-proj-PASTEDSECRET}]", nil,
			[]string{`providers[0].api_key_env: ` + notEnv}},
		{"key envs twice", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_envs: [K1, K1]}]", nil,
			[]string{`providers[0].api_key_envs[1]: "K1" is already api_key_envs[0]; each key is listed once`}},
		{"key envs name", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_envs: [K1, '']}]", nil,
			[]string{`providers[0].api_key_envs[1]: ` + notEnv}},
		{"key file with ~", "providers: [{name: a, base_url: 'https://x/v1', models: [m], api_key_file: ~/k}]", nil,
			[]string{`providers[0].api_key_file: "~/k" starts with ~, which is not expanded here; write the full path`}},
		{"models missing", "providers: [{name: a, base_url: 'https://x/v1'}]", nil,
			[]string{`providers[0].models: required: list the model ids this provider serves, as it names them (e.g. gpt-4o)`}},
		{"model with a space", "providers: [{name: a, base_url: 'https://x/v1', models: [m, 'gpt 4o']}]", nil,
			[]string{`providers[0].models[1]: "gpt 4o" contains spaces or control characters`}},
		{"model twice", "providers: [{name: a, base_url: 'https://x/v1', models: [m, m]}]", nil,
			[]string{`providers[0].models[1]: "m" is already models[0]; list each model once`}},
		{"negative limit", "providers: [{name: a, base_url: 'https://x/v1', models: [m], limits: {rpm: -5}}]", nil,
			[]string{`providers[0].limits.rpm: is -5; must be >= 0 (0 = no limit)`}},
		{"limit too large", "providers: [{name: a, base_url: 'https://x/v1', models: [m], limits: {tpm: 9007199254740992}}]", nil,
			[]string{`providers[0].limits.tpm: is 9007199254740992, above the maximum 9007199254740991`}},
		{"model limits for another model", "providers: [{name: a, base_url: 'https://x/v1', models: [m], model_limits: {gpt-5: {rpm: 1}}}]", nil,
			[]string{`providers[0].model_limits.gpt-5: "gpt-5" is not in providers[0].models; add it there or remove this entry`}},
		{"negative model limit", "providers: [{name: a, base_url: 'https://x/v1', models: [m], model_limits: {m: {concurrency: -1}}}]", nil,
			[]string{`providers[0].model_limits.m.concurrency: is -1; must be >= 0 (0 = no limit)`}},
		{"authorization header", "providers: [{name: a, base_url: 'https://x/v1', models: [m], headers: {Authorization: 'Bearer x'}}]", nil,
			[]string{`providers[0].headers.Authorization: set by llmgate from the provider's key; use api_key_env, api_key_envs or api_key_file`}},
		{"hop-by-hop header", "providers: [{name: a, base_url: 'https://x/v1', models: [m], headers: {connection: close}}]", nil,
			[]string{`providers[0].headers.connection: a hop-by-hop header managed by the HTTP client; remove it`}},
		{"header name", "providers: [{name: a, base_url: 'https://x/v1', models: [m], headers: {'X Org': o}}]", nil,
			[]string{`providers[0].headers.X Org: "X Org" is not a valid header name (letters, digits and !#$%&'*+-.^_` + "`" + `|~)`}},
		{"header reference", "providers: [{name: a, base_url: 'https://x/v1', models: [m], headers: {X-Org: '${ORG'}}]", nil,
			[]string{`providers[0].headers.X-Org: "${" must open a reference to an environment variable, like ${ORG_ID}`}},
		{"header line break", "providers: [{name: a, base_url: 'https://x/v1', models: [m], headers: {X-Org: \"a\\nb\"}}]", nil,
			[]string{`providers[0].headers.X-Org: contains a line break or NUL; a header value is one line`}},

		// Aliases.
		{"alias without name", P + "models: [{targets: [openai/gpt-4o]}]", nil,
			[]string{`models[0].name: is empty`}},
		{"alias twice", P + "models: [{name: fast, targets: [openai/gpt-4o]}, {name: fast, targets: [openai/gpt-4o]}]", nil,
			[]string{`models[1].name: "fast" is already models[0]; alias names must be unique`}},
		{"alias hiding direct targets", P + "models: [{name: openai/fast, targets: [openai/gpt-4o]}]", nil,
			[]string{`models[0].name: "openai/fast" starts with the provider name openai/ and would hide direct provider/model targets; choose another name`}},
		{"alias without targets", P + "models: [{name: fast}]", nil,
			[]string{`models[0].targets: required: list provider/model targets, tried in order, e.g. [openai/gpt-4o, backup/gpt-4o]`}},
		{"target not provider/model", P + "models: [{name: fast, targets: [gpt-4o]}]", nil,
			[]string{`models[0].targets[0]: "gpt-4o" is not provider/model; write it like openai/gpt-4o`}},
		{"target provider unknown", P + "models: [{name: fast, targets: [azure/gpt-4o]}]", nil,
			[]string{`models[0].targets[0]: "azure/gpt-4o": there is no provider named "azure"`}},
		{"target model unknown", P + "models: [{name: fast, targets: [openai/gpt-5]}]", nil,
			[]string{`models[0].targets[0]: "openai/gpt-5": "gpt-5" is not in providers[0].models; add it there or fix the target`}},
		{"target twice", P + "models: [{name: fast, targets: [openai/gpt-4o, openai/gpt-4o]}]", nil,
			[]string{`models[0].targets[1]: "openai/gpt-4o" is already targets[0]; list each target once`}},

		// Tenants.
		{"tenant without name", P + "tenants: [{api_key_sha256: " + shaTest + "}]", nil,
			[]string{`tenants[0].name: required: the tenant's name in limits, budgets, logs and metrics`}},
		{"tenant name", P + "tenants: [{name: 'a b', api_key_sha256: " + shaTest + "}]", nil,
			[]string{`tenants[0].name: "a b": use 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit`}},
		{"tenant twice", T + "  - {name: acme, api_key_sha256: " + shaOther + "}", nil,
			[]string{`tenants[1].name: "acme" is already the name of tenants[0]; names must be unique`}},
		{"tenant without key", P + "tenants: [{name: acme}]", nil,
			[]string{`tenants[0]: set api_key_env (the environment variable holding the tenant's key) or api_key_sha256 (the key's hex SHA-256, so that the file holds no secret)`}},
		{"tenant with two keys", P + "tenants: [{name: acme, api_key_env: K, api_key_sha256: " + shaTest + "}]", nil,
			[]string{`tenants[0]: set only one of api_key_env and api_key_sha256`}},
		{"tenant key env name", P + "tenants: [{name: acme, api_key_env: x-y}]", nil,
			[]string{`tenants[0].api_key_env: ` + notEnv}},
		{"tenants sharing a key env", P + "tenants: [{name: a, api_key_env: K}, {name: b, api_key_env: K}]", nil,
			[]string{`tenants[1].api_key_env: K is already the key of tenants[0]; every tenant needs its own key`}},
		{"tenant sha256 too short", P + "tenants: [{name: acme, api_key_sha256: abc}]", nil,
			[]string{`tenants[0].api_key_sha256: want the 64 hexadecimal characters of the key's SHA-256, e.g. from: printf %s "$KEY" | sha256sum`}},
		{"tenants sharing a sha256", T + "  - {name: b, api_key_sha256: " + strings.ToUpper(shaTest) + "}", nil,
			[]string{`tenants[1].api_key_sha256: is the same key as tenants[0]; every tenant needs its own key`}},
		{"tenant model unknown", P + "tenants: [{name: acme, api_key_env: K, models: [gpt-5]}]", nil,
			[]string{`tenants[0].models[0]: "gpt-5" is not an alias (models:), a model a provider serves, or a provider/model target`}},
		{"tenant model twice", P + "tenants: [{name: acme, api_key_env: K, models: [gpt-4o, gpt-4o]}]", nil,
			[]string{`tenants[0].models[1]: "gpt-4o" is already models[0]; list each model once`}},
		{"tenant limit", P + "tenants: [{name: acme, api_key_env: K, limits: {rpm: -1}}]", nil,
			[]string{`tenants[0].limits.rpm: is -1; must be >= 0 (0 = no limit)`}},
		{"tenant model limits unknown", P + "tenants: [{name: acme, api_key_env: K, model_limits: {gpt-5: {rpm: 1}}}]", nil,
			[]string{`tenants[0].model_limits.gpt-5: "gpt-5" is not an alias (models:), a model a provider serves, or a provider/model target`}},
		{"tenant model limits not allowed", P + "tenants: [{name: acme, api_key_env: K, models: [gpt-4o], model_limits: {gpt-4o-mini: {rpm: 1}}}]", nil,
			[]string{`tenants[0].model_limits.gpt-4o-mini: "gpt-4o-mini" is not in tenants[0].models, so this limit would never apply; add it there or remove this entry`}},
		{"budget without period", P + "tenants: [{name: acme, api_key_env: K, budget: {usd: 5}}]", nil,
			[]string{`tenants[0].budget.period: required: day or month`}},
		{"budget period", P + "tenants: [{name: acme, api_key_env: K, budget: {period: weekly}}]", nil,
			[]string{`tenants[0].budget.period: "weekly" is not a period; use day or month`}},
		{"budget negative usd", P + "tenants: [{name: acme, api_key_env: K, budget: {period: day, usd: -1}}]", nil,
			[]string{`tenants[0].budget.usd: is -1; must be >= 0 US dollars (0 = no money cap)`}},
		{"budget usd too large", P + "tenants: [{name: acme, api_key_env: K, budget: {period: day, usd: 1e10}}]", nil,
			[]string{`tenants[0].budget.usd: is 1e+10, above the maximum 9007199255`}},
		{"budget tokens", P + "tenants: [{name: acme, api_key_env: K, budget: {period: day, tokens: -1}}]", nil,
			[]string{`tenants[0].budget.tokens: is -1; must be >= 0 (0 = no token cap)`}},
		{"budget time zone", P + "tenants: [{name: acme, api_key_env: K, budget: {period: day, timezone: Mars/Olympus}}]", nil,
			[]string{`tenants[0].budget.timezone: "Mars/Olympus" is not a known time zone; use an IANA name such as Europe/Paris or America/New_York, or UTC`}},
		{"budget local time zone", P + "tenants: [{name: acme, api_key_env: K, budget: {period: day, timezone: Local}}]", nil,
			[]string{`tenants[0].budget.timezone: "Local" depends on each host's setting, and replicas must agree on when a period starts; name the zone, e.g. Europe/Paris`}},
		{"tenant priority", P + "tenants: [{name: acme, api_key_env: K, priority: high}]", nil,
			[]string{`tenants[0].priority: "high" is not a priority; use interactive or batch`}},
		{"tenant max wait", P + "tenants: [{name: acme, api_key_env: K, max_wait: -1s}]", nil,
			[]string{`tenants[0].max_wait: is -1s; must be >= 0 (0 = answer 429 at once instead of waiting)`}},

		// Prices.
		{"negative price", P + "prices: {gpt-4o: {input_per_mtok: -1}}", nil,
			[]string{`prices.gpt-4o: price input_per_mtok = -1: want a number of US dollars per million tokens between 0 and 1e+06`}},
		{"price without model", P + `prices: {"": {input_per_mtok: 1}}`, nil,
			[]string{`prices: has an entry with an empty model name`}},

		// Environment overrides.
		{"max wait from env", P, map[string]string{EnvMaxWait: "soon"},
			[]string{`LLMGATE_MAX_WAIT: is "soon", not a duration; write it like 30s or 1m, or 0 to answer 429 at once`}},
		{"log level from env", P, map[string]string{EnvLogLevel: "loud"},
			[]string{`log.level (from LLMGATE_LOG_LEVEL): "loud" is not a level; use debug, info, warn or error`}},
		{"listen from env", P, map[string]string{EnvListen: "nope"},
			[]string{`listen (from LLMGATE_LISTEN): "nope" is not host:port; write it like 127.0.0.1:8080, or :8080 for every interface`}},
		{"cache store from env", P, map[string]string{EnvCacheStore: "bogus://:s3cret@x"},
			[]string{`cache.store (from LLMGATE_CACHE_STORE): "bogus://xxxxx@x" is neither memory nor a redis URL; write it like redis://[user:password@]host:6379[/db], rediss://... (TLS) or unix:///path/to/redis.sock`}},
		{"sentinel password without a master set", P + "cache: {store: 'redis://h1:1,h2:2?sentinel_password=s3cret'}", nil,
			[]string{`cache.store: "redis://h1:1,h2:2?sentinel_password=xxxxx": sentinel_username and sentinel_password need master_set (a Sentinel URL)`}},
		{"store from env", P, map[string]string{EnvStore: "bogus://x"},
			[]string{`store (from LLMGATE_STORE): "bogus://x" is neither memory nor a redis URL; write it like redis://[user:password@]host:6379[/db], rediss://... (TLS) or unix:///path/to/redis.sock`}},
		{"public listen from env without tenants", P, map[string]string{EnvListen: "0.0.0.0:80"},
			[]string{`tenants: none, and listen "0.0.0.0:80" is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1`}},

		// Keys present in the environment.
		{"tenants sharing a key value", P + "tenants: [{name: a, api_key_env: A_KEY}, {name: b, api_key_env: B_KEY}]",
			map[string]string{"A_KEY": "same-key-0123456789", "B_KEY": "same-key-0123456789"},
			[]string{`tenants[1].api_key_env: $B_KEY holds the same key as tenants[0]; every tenant needs its own key`}},
		{"tenant key equal to another's sha256", T + "  - {name: b, api_key_env: B_KEY}",
			map[string]string{"B_KEY": "test"},
			[]string{`tenants[1].api_key_env: $B_KEY holds the same key as tenants[0]; every tenant needs its own key`}},
		{"admin token equal to a tenant key", T,
			map[string]string{DefaultAdminTokenEnv: "test"},
			[]string{`admin_token_env: $LLMGATE_ADMIN_TOKEN holds the same key as tenants[0]; the admin token must differ from every tenant key`}},
		{"provider key with a space", P,
			map[string]string{"OPENAI_API_KEY": "sk-abc def"},
			[]string{`providers[0].api_key_env: $OPENAI_API_KEY contains spaces or control characters; check its value`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("test.yaml", []byte(tc.yaml), env(tc.env))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", c)
			}
			if !isInvalid(err) || errors.Is(err, ErrSyntax) {
				t.Fatalf("error %v: want ErrInvalid", err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("error %v: want a *FieldError inside", err)
			}
			sameProblems(t, problems(err), tc.want)
			// Parse's message names the file and carries every problem.
			if msg := err.Error(); !strings.HasPrefix(msg, "config: test.yaml: ") || !strings.Contains(msg, tc.want[0]) {
				t.Errorf("message %q", msg)
			}
			noSecret(t, "error", err.Error(), "hunter2", "same-key-0123456789", "sk-abc def", "PASTEDSECRET")
		})
	}
}

// TestValidateAllAtOnce checks that problems in every section come back
// together, and how Parse formats several.
func TestValidateAllAtOnce(t *testing.T) {
	yaml := `
listen: nope
upstream: {max_attempts: 0, backoff_base: -1s}
providers: [{name: A, base_url: 'ftp://x', models: []}]
tenants: [{name: t}]
`
	_, err := Parse("all.yaml", []byte(yaml), nil)
	got := problems(err)
	if len(got) < 6 {
		t.Fatalf("%d problems, want at least 6: %q", len(got), got)
	}
	// max_attempts: 0 means the default; -1s is refused.
	for _, want := range []string{"listen:", "upstream.backoff_base:", "providers[0].name:", "providers[0].base_url:", "providers[0].models:", "tenants[0]:"} {
		found := false
		for _, g := range got {
			found = found || strings.HasPrefix(g, want)
		}
		if !found {
			t.Errorf("no problem about %s in %q", want, got)
		}
	}
	if want := "config: all.yaml: " + strconv.Itoa(len(got)) + " problems:\n  listen: "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message starts %q, want %q", err.Error()[:min(len(err.Error()), 60)], want)
	}
}

// TestValidateGoBuilt covers values only a Config built in Go can hold.
func TestValidateGoBuilt(t *testing.T) {
	c := mustParse(t, providerBlock, nil)
	c.StateDir = ""
	c.MaxBodyBytes = -1
	sameProblems(t, problems(c.Validate(nil)), []string{
		`state_dir: has no default here (XDG_STATE_HOME and HOME are unset); set state_dir or LLMGATE_STATE_DIR to a directory where budgets and usage persist`,
		`max_body_bytes: is -1; must be a positive size such as 8MiB`,
	})

	var nilConfig *Config
	if err := nilConfig.Validate(nil); !isInvalid(err) {
		t.Errorf("nil Config: %v", err)
	}

	// A valid configuration stays valid through another Validate and
	// another SetDefaults.
	c = mustParse(t, providerBlock, nil)
	c.SetDefaults(nil)
	if err := c.Validate(env(map[string]string{"OPENAI_API_KEY": "sk-x"})); err != nil {
		t.Errorf("Validate again: %v", err)
	}
}

func TestValidateAccepts(t *testing.T) {
	for name, yaml := range map[string]string{
		"localhost listen without tenants":  providerBlock + "listen: localhost:9000",
		"IPv6 loopback without tenants":     providerBlock + `listen: "[::1]:9000"`,
		"port 0":                            providerBlock + "listen: 127.0.0.1:0",
		"public listen with tenants":        providerBlock + "listen: 0.0.0.0:8080\ntenants: [{name: a, api_key_env: A}]",
		"redis store":                       providerBlock + "store: redis://:pw@localhost:6379/2",
		"unix store":                        providerBlock + "store: unix:///run/redis.sock",
		"no wait":                           providerBlock + "max_wait: 0s",
		"keyless local provider":            "providers: [{name: local, base_url: 'http://127.0.0.1:11434/v1', models: ['llama3.1:8b']}]",
		"model ids with slashes":            "providers: [{name: together, base_url: 'https://api.together.xyz/v1', api_key_env: T, models: [meta-llama/Llama-3-8b]}]",
		"alias named like a model":          providerBlock + "models: [{name: gpt-4o, targets: [openai/gpt-4o-mini]}]",
		"upper-case sha256":                 providerBlock + "tenants: [{name: a, api_key_sha256: " + strings.ToUpper(shaTest) + "}]",
		"tenant using provider/model":       providerBlock + "tenants: [{name: a, api_key_env: A, models: [openai/gpt-4o], model_limits: {openai/gpt-4o: {rpm: 5}}}]",
		"budget that only accounts":         providerBlock + "tenants: [{name: a, api_key_env: A, budget: {period: monthly}}]",
		"max_wait key left empty (default)": providerBlock + "max_wait:",
	} {
		t.Run(name, func(t *testing.T) {
			mustParse(t, yaml, nil)
		})
	}
	c := mustParse(t, providerBlock+"max_wait:", nil)
	if c.MaxWait != DefaultMaxWait {
		t.Errorf("empty max_wait: MaxWait %v, want the default %v", c.MaxWait, DefaultMaxWait)
	}
	c = mustParse(t, providerBlock+"max_wait: 0s", nil)
	if c.MaxWait != 0 {
		t.Errorf("max_wait 0s: MaxWait %v, want 0", c.MaxWait)
	}
}

func TestWarnings(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"none", providerBlock + "tenants: [{name: a, api_key_env: A}]", nil},
		{"open access", providerBlock,
			[]string{"no tenants: anyone who can connect to 127.0.0.1:8080 uses the gateway without a key (allowed only on a loopback address)"}},
		{"plain http to a remote host", "providers: [{name: r, base_url: 'http://llm.example.com/v1', api_key_env: K, models: [m]}]\ntenants: [{name: a, api_key_env: A}]",
			[]string{"providers[0] (r): base_url is plain http to llm.example.com, not a loopback address: keys and prompts cross the network unencrypted; use https"}},
		{"keyless remote provider", "providers: [{name: r, base_url: 'https://llm.example.com/v1', models: [m]}]\ntenants: [{name: a, api_key_env: A}]",
			[]string{"providers[0] (r): no api_key_env, api_key_envs or api_key_file: requests reach llm.example.com without a key"}},
		{"keyless loopback provider is fine", "providers: [{name: r, base_url: 'http://localhost:8000/v1', models: [m]}]\ntenants: [{name: a, api_key_env: A}]", nil},
		{"alias hiding a model", providerBlock + "models: [{name: gpt-4o, targets: [openai/gpt-4o-mini]}]\ntenants: [{name: a, api_key_env: A}]",
			[]string{`models[0]: alias "gpt-4o" hides the model of that name served by openai: clients asking for it get openai/gpt-4o-mini instead`}},
		{"alias ordering a model's providers is fine", providerBlock + "  - {name: b, base_url: 'https://b/v1', api_key_env: B, models: [gpt-4o]}\nmodels: [{name: gpt-4o, targets: [b/gpt-4o, openai/gpt-4o]}]\ntenants: [{name: a, api_key_env: A}]", nil},
		{"usd budget with unpriced models", "providers: [{name: r, base_url: 'https://r/v1', api_key_env: K, models: [gpt-4o, house-model, house-2]}]\ntenants: [{name: a, api_key_env: A, budget: {period: day, usd: 5}}]",
			[]string{"tenants[0] (a) has a usd budget, but house-model, house-2 have no price: requests for them cannot be admitted under a money cap; add them under prices"}},
		{"usd budget limited to priced models is fine", "providers: [{name: r, base_url: 'https://r/v1', api_key_env: K, models: [gpt-4o, house-model]}]\ntenants: [{name: a, api_key_env: A, models: [gpt-4o], budget: {period: day, usd: 5}}]", nil},
		{"token budget needs no price", "providers: [{name: r, base_url: 'https://r/v1', api_key_env: K, models: [house-model]}]\ntenants: [{name: a, api_key_env: A, budget: {period: day, tokens: 5}}]", nil},
		{"configured price", "providers: [{name: r, base_url: 'https://r/v1', api_key_env: K, models: [house-model]}]\ntenants: [{name: a, api_key_env: A, budget: {period: day, usd: 5}}]\nprices: {house-model: {input_per_mtok: 1}}", nil},
		{"cache on the Redis of the budgets", providerBlock + "store: redis://r:6379\ntenants: [{name: a, api_key_env: A, budget: {period: day, tokens: 5}}]",
			[]string{"cache: answers are kept on the Redis that holds the budgets (cache.store is empty or the same URL): a cache filling its memory makes that Redis evict keys or refuse writes, budgets and locks included, depending on its maxmemory-policy; give the cache a Redis of its own in cache.store (docs/cache.md)"}},
		{"cache on a Redis of its own", providerBlock + "store: redis://r:6379\ncache: {store: redis://c:6379}\ntenants: [{name: a, api_key_env: A, budget: {period: day, tokens: 5}}]", nil},
		{"cache on the Redis, no budgets", providerBlock + "store: redis://r:6379\ntenants: [{name: a, api_key_env: A}]", nil},
		{"waiting as long as the deadline", providerBlock + "max_wait: 10m\ntenants: [{name: a, api_key_env: A, max_wait: 11m}]",
			[]string{
				"max_wait 10m is not shorter than request_timeout 10m: a request can spend its whole deadline waiting",
				"tenants[0] (a): max_wait 11m is not shorter than request_timeout 10m: a request can spend its whole deadline waiting",
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sameProblems(t, mustParse(t, tc.yaml, nil).Warnings(), tc.want)
		})
	}
}

func TestTenantHelpers(t *testing.T) {
	c := mustParse(t, providerBlock+`
tenants:
  - {name: a, api_key_env: A, models: [gpt-4o], priority: batch, max_wait: 2s,
     budget: {period: Monthly, usd: 12.5, tokens: 1000, timezone: Europe/Paris}}
  - {name: b, api_key_env: B}
`, nil)
	a, b := &c.Tenants[0], &c.Tenants[1]
	if !a.Allows("gpt-4o") || a.Allows("gpt-4o-mini") || !b.Allows("anything") {
		t.Error("Allows")
	}
	if a.MaxWaitOr(time.Minute) != 2*time.Second || b.MaxWaitOr(time.Minute) != time.Minute {
		t.Error("MaxWaitOr")
	}
	if a.RatePriority() == b.RatePriority() || b.Priority != PriorityInteractive {
		t.Errorf("priorities %v %v (%q)", a.RatePriority(), b.RatePriority(), b.Priority)
	}
	bud, err := a.Budget.Budget(a.Name)
	if err != nil {
		t.Fatal(err)
	}
	if bud.Tenant != "a" || bud.Period != "month" || bud.MicroUSD != 12_500_000 || bud.Tokens != 1000 || bud.Location.String() != "Europe/Paris" {
		t.Errorf("Budget() = %+v", bud)
	}
	if _, err := (&TenantBudget{Period: "week"}).Budget("a"); err == nil {
		t.Error("Budget() accepted period week")
	}
}
