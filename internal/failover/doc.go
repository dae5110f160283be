// Package failover tests the lock, rate limiter, budgets, de-duplication and response cache through a Redis master failover, on Sentinel and on Cluster.
//
// It has no code of its own: see failover_test.go and docs/failover.md,
// which states what each capability promises from what these tests
// measure.
package failover
