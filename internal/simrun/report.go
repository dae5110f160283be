package simrun

import "io"

// WriteReport writes r as one self-contained HTML page.
func WriteReport(w io.Writer, r *Result) error {
	_, err := io.WriteString(w, "<!doctype html><title>llmgate sim</title>")
	return err
}
