module github.com/llmgate/llmgate

go 1.26.8

require (
	github.com/redis/rueidis v1.0.79
	golang.org/x/sys v0.47.0
)
