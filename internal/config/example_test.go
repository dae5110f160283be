package config_test

import (
	"fmt"
	"os"

	"github.com/llmgate/llmgate/internal/config"
)

func ExampleParse() {
	yaml := `
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    api_key_envs: [OPENAI_KEY_1, OPENAI_KEY_2]
    models: [gpt-4o, gpt-4o-mini]
    limits: {rpm: 500, tpm: 30000}
    model_limits:
      gpt-4o-mini: {tpm: 200000}
  - name: backup
    base_url: https://llm.example.com/v1
    api_key_env: BACKUP_KEY
    models: [gpt-4o]
models:
  - name: smart
    targets: [openai/gpt-4o, backup/gpt-4o]
`
	getenv := func(name string) string {
		return map[string]string{"OPENAI_KEY_1": "sk-1", "OPENAI_KEY_2": "sk-2", "BACKUP_KEY": "sk-3"}[name]
	}
	c, err := config.Parse("gateway.yaml", []byte(yaml), getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	for _, model := range []string{"smart", "gpt-4o", "backup/gpt-4o", "gpt-5"} {
		targets, ok := c.Targets(model)
		fmt.Println(model, "->", targets, ok)
	}
	deployments, err := c.Deployments(getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	for _, d := range deployments {
		fmt.Printf("%s rpm=%d tpm=%d\n", d, d.Limits.RPM, d.Limits.TPM)
	}
	// Output:
	// smart -> [openai/gpt-4o backup/gpt-4o] true
	// gpt-4o -> [openai/gpt-4o backup/gpt-4o] true
	// backup/gpt-4o -> [backup/gpt-4o] true
	// gpt-5 -> [] false
	// openai#1/gpt-4o (key OPENAI_KEY_1) rpm=500 tpm=30000
	// openai#1/gpt-4o-mini (key OPENAI_KEY_1) rpm=500 tpm=200000
	// openai#2/gpt-4o (key OPENAI_KEY_2) rpm=500 tpm=30000
	// openai#2/gpt-4o-mini (key OPENAI_KEY_2) rpm=500 tpm=200000
	// backup/gpt-4o (key BACKUP_KEY) rpm=0 tpm=0
}

func ExampleParse_invalid() {
	_, err := config.Parse("gateway.yaml", []byte(`
listen: 0.0.0.0:8080
providers:
  - name: openai
    base_url: https://api.openai.com/v1
    models: [gpt-4o]
    limits: {rpm: -1}
`), nil)
	fmt.Println(err)
	// Output:
	// config: gateway.yaml: 2 problems:
	//   tenants: none, and listen "0.0.0.0:8080" is not a loopback address: anyone who can reach it could spend your provider keys; add tenants (docs/config.md) or listen on 127.0.0.1
	//   providers[0].limits.rpm: is -1; must be >= 0 (0 = no limit)
}
