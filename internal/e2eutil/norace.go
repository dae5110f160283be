//go:build !race

package e2eutil

// raceEnabled reports whether this binary runs under the race detector;
// the llmgate binary is then built with it too.
const raceEnabled = false
