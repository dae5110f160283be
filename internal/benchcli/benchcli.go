// Package benchcli is what the llmgate bench commands share: a flag set, the --help text, usage errors and exit codes.
package benchcli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
)

// Exit codes of every bench command.
const (
	ExitOK    = 0
	ExitFail  = 1 // the run failed, or what it measured is wrong
	ExitUsage = 2 // bad flags or arguments
)

// Command is one run of a bench command: its flags and where it writes.
type Command struct {
	// Name prefixes every message, e.g. "llmgate bench lock".
	Name string
	// Synopsis is the usage line (or lines), shown by --help and after
	// every usage error.
	Synopsis string
	// About is the paragraph under the synopsis in --help.
	About string
	// Hidden flags are left out of --help: they are for the command's
	// own worker processes, not for users.
	Hidden map[string]bool
	// More, if set, writes what --help shows after the flags.
	More func(w io.Writer)

	Flags          *flag.FlagSet
	Stdout, Stderr io.Writer
}

// New returns a Command with an empty flag set that reports nothing on its
// own: Parse and Bad say what went wrong, once.
func New(name, synopsis, about string, stdout, stderr io.Writer) *Command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return &Command{Name: name, Synopsis: synopsis, About: about, Flags: fs, Stdout: stdout, Stderr: stderr}
}

// JSON defines --json, which every bench command has.
func (c *Command) JSON() *bool {
	return c.Flags.Bool("json", false, "print one JSON object instead of a table")
}

// CPUProfile defines --cpuprofile, the file StartCPUProfile writes to.
func (c *Command) CPUProfile() *string {
	return c.Flags.String("cpuprofile", "", "write a CPU profile of this process to `file`")
}

// Parse parses args. When ok is false the command is over and code is its
// exit code: --help was printed (ExitOK), or a bad flag or a stray argument
// was reported (ExitUsage).
func (c *Command) Parse(args []string) (code int, ok bool) {
	if err := c.Flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.Usage(c.Stdout)
			return ExitOK, false
		}
		return c.Bad("%v", err), false
	}
	if c.Flags.NArg() > 0 {
		return c.Bad("unexpected argument %q", c.Flags.Arg(0)), false
	}
	return ExitOK, true
}

// Given returns the names of the flags set on the command line.
func (c *Command) Given() map[string]bool {
	set := map[string]bool{}
	c.Flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// Bad reports a usage error with the synopsis and returns ExitUsage.
func (c *Command) Bad(format string, a ...any) int {
	fmt.Fprintf(c.Stderr, c.Name+": "+format+"\n", a...)
	fmt.Fprintln(c.Stderr, c.Synopsis)
	fmt.Fprintf(c.Stderr, "run '%s --help' for all flags\n", c.Name)
	return ExitUsage
}

// Fail reports err and returns ExitFail.
func (c *Command) Fail(err error) int {
	fmt.Fprintf(c.Stderr, "%s: %v\n", c.Name, err)
	return ExitFail
}

// Usage writes the --help text: synopsis, about, every flag but the hidden
// ones, then More.
func (c *Command) Usage(w io.Writer) {
	fmt.Fprintln(w, c.Synopsis)
	if c.About != "" {
		fmt.Fprintln(w, "\n"+c.About)
	}
	fmt.Fprintln(w, "\nflags:")
	c.Flags.VisitAll(func(f *flag.Flag) {
		if c.Hidden[f.Name] {
			return
		}
		name, help := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		fmt.Fprintf(w, "  --%s%s\n    \t%s", f.Name, name, help)
		switch f.DefValue {
		case "", "false", "0", "0s":
		default:
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
	if c.More != nil {
		c.More(w)
	}
}

// StartCPUProfile writes a CPU profile of this process to path until stop
// is called. With path "" it does nothing.
func StartCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
