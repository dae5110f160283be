// Package e2etopo tests the gateway on a Redis Cluster and on Sentinel: three 'llmgate serve' replicas sharing limits, budgets, de-duplication, sessions and the cache on each topology, and serving through a master's failover under load.
//
// It has no code of its own: see topology_test.go, failover_test.go and
// docs/failover.md. A package apart from internal/app so that its tests
// run in parallel with that package's.
package e2etopo
