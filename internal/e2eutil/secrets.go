package e2eutil

import (
	"strings"
	"testing"
)

// Secrets the end-to-end tests hand to the gateway replicas. None of them
// may ever show up in a replica's output.
const (
	ProviderKey = "sk-e2e-provider-7f3a9c41d2"
	OtherKey    = "sk-e2e-other-key-88e0b6a3" // a key the provider refuses
	TenantKey   = "sk-e2e-tenant-51b2d8e7f0"
	AdminToken  = "e2e-admin-token-c04e1f93"
	RedisPass   = "e2e-redis-pass-9d7b22c5"
)

// secrets lists every secret for the log checks.
var secrets = []string{ProviderKey, OtherKey, TenantKey, AdminToken, RedisPass}

// Env is the environment of every replica: where the configuration's
// *_env settings find the secrets.
var Env = []string{
	"E2E_PROVIDER_KEY=" + ProviderKey,
	"E2E_OTHER_KEY=" + OtherKey,
	"E2E_TENANT_KEY=" + TenantKey,
	"LLMGATE_ADMIN_TOKEN=" + AdminToken,
}

// AssertNoSecrets fails the test if text holds any of the e2e secrets.
func AssertNoSecrets(t testing.TB, where, text string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret %s... (as <SECRET> below):\n%s", where, s[:6], strings.ReplaceAll(text, s, "<SECRET>"))
		}
	}
}
