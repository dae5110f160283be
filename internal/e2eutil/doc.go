// Package e2eutil runs 'llmgate serve' replicas as real processes in front of a recording simulated provider, for end-to-end tests.
//
// A test package builds the binary once in its TestMain (Build), starts
// replicas on a configuration (StartReplicas, StartReplicasYAML) and talks
// to them with the official OpenAI SDK (Replica.SDK) or raw HTTP (Send).
// Every replica's output is checked for the test secrets and data races
// when the test ends.
package e2eutil
