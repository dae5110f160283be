module github.com/llmgate/llmgate

go 1.26.8

require (
	github.com/openai/openai-go/v3 v3.98.0
	github.com/redis/rueidis v1.0.79
	golang.org/x/sys v0.48.0
)

require (
	github.com/coder/websocket v1.8.15 // indirect
	github.com/tidwall/gjson v1.20.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
)
