package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// event is what one Next call returned; data "<nil>" stands for nil.
type event struct {
	raw, data string
	err       error
}

const nilData = "<nil>"

func (e event) String() string { return fmt.Sprintf("{raw %q data %q err %v}", e.raw, e.data, e.err) }

// readEvents calls Next until io.EOF or an error other than
// io.ErrUnexpectedEOF, which must be followed by io.EOF.
func readEvents(t testing.TB, r io.Reader) []event {
	t.Helper()
	er := NewEventReader(r)
	var evs []event
	for range 1 << 20 { // far more than any test input has events
		raw, data, err := er.Next()
		if err == io.EOF {
			if raw != nil || data != nil {
				t.Fatalf("io.EOF with raw %q data %q", raw, data)
			}
			// And it stays at the end.
			if raw, data, err := er.Next(); err != io.EOF || raw != nil || data != nil {
				t.Fatalf("Next after io.EOF = %q, %q, %v", raw, data, err)
			}
			return evs
		}
		e := event{raw: string(raw), data: nilData, err: err}
		if data != nil {
			e.data = string(data)
		}
		evs = append(evs, e)
		switch {
		case err == nil, errors.Is(err, io.ErrUnexpectedEOF):
		default:
			return evs
		}
	}
	t.Fatal("no io.EOF")
	return nil
}

// Readers that split the input differently; every one must give the same
// events.
var splitters = []struct {
	name string
	wrap func(io.Reader) io.Reader
}{
	{"whole", func(r io.Reader) io.Reader { return r }},
	{"one byte", iotest.OneByteReader},
	{"half", iotest.HalfReader},
	{"data with EOF", iotest.DataErrReader},
	{"3 bytes", func(r io.Reader) io.Reader { return &chunkReader{r: r, n: 3} }},
	{"7 bytes", func(r io.Reader) io.Reader { return &chunkReader{r: r, n: 7} }},
}

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

func ev(raw, data string) event { return event{raw: raw, data: data} }

// chat is a real OpenAI chat stream with include_usage.
var chat = "data: " + chunkRole + "\n\n" +
	"data: " + chunkContent + "\n\n" +
	"data: " + chunkFinish + "\n\n" +
	"data: " + chunkUsageOnly + "\n\n" +
	"data: [DONE]\n\n"

func TestEventReader(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  []event
	}{
		{"empty", "", nil},
		{"only blank lines", "\n\r\n\n", nil},
		{"only whitespace", " \t\n  ", nil},
		{
			"chat stream", chat,
			[]event{
				ev("data: "+chunkRole+"\n\n", chunkRole),
				ev("data: "+chunkContent+"\n\n", chunkContent),
				ev("data: "+chunkFinish+"\n\n", chunkFinish),
				ev("data: "+chunkUsageOnly+"\n\n", chunkUsageOnly),
				ev("data: [DONE]\n\n", "[DONE]"),
			},
		},
		{
			"CRLF", "data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n",
			[]event{ev("data: {\"a\":1}\r\n\r\n", `{"a":1}`), ev("data: [DONE]\r\n\r\n", "[DONE]")},
		},
		{
			"comments", ": keep-alive\n\n: OPENROUTER PROCESSING\n\ndata: x\n\n",
			[]event{ev(": keep-alive\n\n", nilData), ev(": OPENROUTER PROCESSING\n\n", nilData), ev("data: x\n\n", "x")},
		},
		{
			"comment inside an event", "data: a\n: ping\ndata: b\n\n",
			[]event{ev("data: a\n: ping\ndata: b\n\n", "a\nb")},
		},
		{
			"multi-line data", "data: {\ndata:  \"a\": 1\ndata:}\n\n",
			[]event{ev("data: {\ndata:  \"a\": 1\ndata:}\n\n", "{\n \"a\": 1\n}")},
		},
		{
			"no space, one space, two spaces", "data:a\n\ndata: a\n\ndata:  a\n\n",
			[]event{ev("data:a\n\n", "a"), ev("data: a\n\n", "a"), ev("data:  a\n\n", " a")},
		},
		{
			"empty data", "data:\n\ndata: \n\ndata:\ndata:\n\n",
			[]event{ev("data:\n\n", ""), ev("data: \n\n", ""), ev("data:\ndata:\n\n", "\n")},
		},
		{
			"other fields", "event: error\nid: 7\nretry: 1000\ndata: {\"error\":{}}\n\nevent: ping\n\n",
			[]event{ev("event: error\nid: 7\nretry: 1000\ndata: {\"error\":{}}\n\n", `{"error":{}}`), ev("event: ping\n\n", nilData)},
		},
		{
			"Data is not data", "Data: x\n data: y\ndatum: z\n\n",
			[]event{ev("Data: x\n data: y\ndatum: z\n\n", nilData)},
		},
		{
			"blank lines before and between events are skipped", "\n\r\n\ndata: a\n\n\n\r\n\ndata: b\n\n\n\n",
			[]event{ev("data: a\n\n", "a"), ev("data: b\n\n", "b")},
		},
		{
			"a blank line of several CRs", "data: a\r\r\n\r\r\ndata: b\n\n",
			[]event{ev("data: a\r\r\n\r\r\n", "a"), ev("data: b\n\n", "b")},
		},
		{
			"whitespace is not a blank line", " \ndata: a\n\n",
			[]event{ev(" \ndata: a\n\n", "a")},
		},
		{
			"body ends mid-event", "data: a\n\ndata: {\"choices\":[{\"del",
			[]event{ev("data: a\n\n", "a"), {raw: "data: {\"choices\":[{\"del", data: `{"choices":[{"del`, err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends after a data line", "data: a\n\ndata: b\n",
			[]event{ev("data: a\n\n", "a"), {raw: "data: b\n", data: "b", err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends after data lines and a field", "data: a\ndata: b\nid: 5",
			[]event{{raw: "data: a\ndata: b\nid: 5", data: "a\nb", err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends in a CRLF", "data: a\r\n",
			[]event{{raw: "data: a\r\n", data: "a", err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends after a CR", "data: a\n\r",
			[]event{{raw: "data: a\n\r", data: "a", err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends in a comment", ": ping",
			[]event{{raw: ": ping", data: nilData, err: io.ErrUnexpectedEOF}},
		},
		{
			"body ends in a partial data line", "data: x\n\nda",
			[]event{ev("data: x\n\n", "x"), {raw: "da", data: nilData, err: io.ErrUnexpectedEOF}},
		},
		{
			// Whitespace after the last event is not an event.
			"trailing whitespace", "data: x\n\n  \t",
			[]event{ev("data: x\n\n", "x")},
		},
		{
			"trailing whitespace line", "data: x\n\n \n",
			[]event{ev("data: x\n\n", "x")},
		},
		{
			"missing final newline", "data: [DONE]\n",
			[]event{{raw: "data: [DONE]\n", data: "[DONE]", err: io.ErrUnexpectedEOF}},
		},
		{
			"binary", "data: \x00\xff\xfe\n\n",
			[]event{ev("data: \x00\xff\xfe\n\n", "\x00\xff\xfe")},
		},
	} {
		for _, s := range splitters {
			t.Run(tc.name+"/"+s.name, func(t *testing.T) {
				got := readEvents(t, s.wrap(strings.NewReader(tc.input)))
				if !eventsEqual(got, tc.want) {
					t.Fatalf("events\n got %v\nwant %v", got, tc.want)
				}
			})
		}
	}
}

func eventsEqual(a, b []event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].raw != b[i].raw || a[i].data != b[i].data || !errors.Is(a[i].err, b[i].err) || (a[i].err == nil) != (b[i].err == nil) {
			return false
		}
	}
	return true
}

// TestEventReaderSplit splits a stream in two at every offset: an event
// split across reads is put back together.
func TestEventReaderSplit(t *testing.T) {
	input := "data: " + chunkContent + "\r\n\r\n: keep-alive\n\ndata: a\ndata: b\n\ndata: [DONE]\n\n"
	want := readEvents(t, strings.NewReader(input))
	if len(want) != 4 {
		t.Fatalf("%d events, want 4: %v", len(want), want)
	}
	for i := range len(input) + 1 {
		r := io.MultiReader(strings.NewReader(input[:i]), strings.NewReader(input[i:]))
		if got := readEvents(t, r); !eventsEqual(got, want) {
			t.Fatalf("split at %d: got %v, want %v", i, got, want)
		}
	}
}

var errBroken = errors.New("connection reset by peer")

func TestEventReaderReadError(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  []event
	}{
		{"between events", "data: a\n\n", []event{ev("data: a\n\n", "a"), {raw: "", data: nilData, err: errBroken}}},
		{"in a line", "data: a\n\ndat", []event{ev("data: a\n\n", "a"), {raw: "dat", data: nilData, err: errBroken}}},
		{"after a data line", "data: a\n", []event{{raw: "data: a\n", data: "a", err: errBroken}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := io.MultiReader(strings.NewReader(tc.input), iotest.ErrReader(errBroken))
			got := readEvents(t, r)
			if !eventsEqual(got, tc.want) {
				t.Fatalf("events\n got %v\nwant %v", got, tc.want)
			}
			last := got[len(got)-1].err
			if !strings.HasPrefix(last.Error(), "openai: ") || errors.Is(last, io.ErrUnexpectedEOF) {
				t.Fatalf("read error %q", last)
			}
		})
	}
}

// repeatReader yields b forever.
type repeatReader struct{ b byte }

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r.b
	}
	return len(p), nil
}

// cycleReader yields s over and over.
type cycleReader struct {
	s   string
	off int
}

func (r *cycleReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r.s[r.off]
		r.off = (r.off + 1) % len(r.s)
	}
	return len(p), nil
}

func TestEventReaderTooLarge(t *testing.T) {
	const done = "data: [DONE]\n\n"
	// exactly sized is the largest event that is allowed: its raw bytes,
	// terminators included, are MaxEventBytes long.
	exactly := func(extra int) string {
		return "data: " + strings.Repeat("x", MaxEventBytes-len("data: \n\n")+extra) + "\n\n"
	}
	t.Run("at the limit", func(t *testing.T) {
		in := exactly(0)
		er := NewEventReader(strings.NewReader(in + done))
		raw, data, err := er.Next()
		if err != nil || len(raw) != MaxEventBytes || len(data) != MaxEventBytes-len("data: \n\n") {
			t.Fatalf("Next: %d raw bytes, %d data bytes, %v", len(raw), len(data), err)
		}
		if _, data, err := er.Next(); err != nil || string(data) != "[DONE]" {
			t.Fatalf("after a large event: %q, %v", data, err)
		}
	})
	for _, tc := range []struct {
		name string
		r    io.Reader
	}{
		{"one byte over", strings.NewReader(exactly(1) + done)},
		{"many lines", strings.NewReader(strings.Repeat("data: "+strings.Repeat("y", 1000)+"\n", MaxEventBytes/1000) + "\n" + done)},
		{"one long line at the end of the body", strings.NewReader("data: " + strings.Repeat("z", MaxEventBytes))},
		{"an endless line", repeatReader{'a'}},
		{"endless carriage returns", repeatReader{'\r'}},
		{"endless data lines", &cycleReader{s: "data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\r\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			er := NewEventReader(tc.r)
			raw, data, err := er.Next()
			if !errors.Is(err, ErrEventTooLarge) || raw != nil || data != nil {
				t.Fatalf("Next = %d raw bytes, %d data bytes, %v; want ErrEventTooLarge", len(raw), len(data), err)
			}
			if n := cap(er.event); n > 2*MaxEventBytes {
				t.Fatalf("buffered %d bytes for one event", n)
			}
		})
	}
}

// TestEventReaderChat reads a whole chat stream the way the gateway does.
func TestEventReaderChat(t *testing.T) {
	stream := chatStream(5)
	er := NewEventReader(iotest.OneByteReader(bytes.NewReader(stream)))
	var content int
	var usage *Usage
	var out []byte
	for range 100 {
		raw, data, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, raw...)
		c := ParseChunk(data)
		if c.Content {
			content++
		}
		if c.Usage != nil {
			if !c.UsageOnly {
				t.Fatalf("usage chunk with choices: %s", data)
			}
			usage = c.Usage
		}
		if c.Done {
			break
		}
	}
	if !bytes.Equal(out, stream) {
		t.Fatalf("raw events do not add up to the stream")
	}
	if content != 5 {
		t.Errorf("%d content chunks, want 5", content)
	}
	if usage == nil || usage.PromptTokens != 19 || usage.CompletionTokens != 5 || usage.TotalTokens != 24 {
		t.Errorf("usage %s", fmtUsage(usage))
	}
}

// isBlankLine reports whether line (without its '\n') ends an event.
func isBlankLine(line []byte) bool { return len(bytes.TrimRight(line, "\r")) == 0 }

// checkEvents asserts the events read from input account for all of it:
// each event's raw bytes follow the previous one's, after only blank lines;
// a complete event ends at its first blank line; a partial one ends the
// input; after the last there is only whitespace. And each event's data is
// its "data:" lines' payloads joined with "\n".
func checkEvents(t *testing.T, input []byte, evs []event) {
	t.Helper()
	pos := 0
	for i, e := range evs {
		if e.err != nil && !errors.Is(e.err, io.ErrUnexpectedEOF) {
			t.Fatalf("event %d: %v", i, e.err)
		}
		if e.err != nil && i != len(evs)-1 {
			t.Fatalf("event %d: %v before the last event", i, e.err)
		}
		for { // skip blank lines
			nl := bytes.IndexByte(input[pos:], '\n')
			if nl < 0 || !isBlankLine(input[pos:pos+nl]) {
				break
			}
			pos += nl + 1
		}
		if !bytes.HasPrefix(input[pos:], []byte(e.raw)) {
			t.Fatalf("event %d %q is not the input at %d: %q", i, e.raw, pos, input[pos:])
		}
		pos += len(e.raw)
		lines := bytes.SplitAfter([]byte(e.raw), []byte("\n"))
		if len(lines[len(lines)-1]) == 0 {
			lines = lines[:len(lines)-1]
		}
		for j, l := range lines {
			complete := bytes.HasSuffix(l, []byte("\n"))
			blank := complete && isBlankLine(l[:len(l)-1])
			last := j == len(lines)-1
			switch {
			case e.err == nil && last && !blank:
				t.Fatalf("event %d %q does not end in a blank line", i, e.raw)
			case blank && !(e.err == nil && last):
				t.Fatalf("event %d %q has a blank line inside", i, e.raw)
			case !complete && e.err == nil:
				t.Fatalf("event %d %q has a partial line", i, e.raw)
			}
		}
		if e.err != nil && pos != len(input) {
			t.Fatalf("partial event %d %q before the end of the input", i, e.raw)
		}
		var data [][]byte
		for _, l := range lines {
			l = bytes.TrimRight(l, "\r\n")
			if v, ok := bytes.CutPrefix(l, []byte("data:")); ok {
				data = append(data, bytes.TrimPrefix(v, []byte(" ")))
			}
		}
		want := nilData
		if data != nil {
			want = string(bytes.Join(data, []byte("\n")))
		}
		if e.data != want {
			t.Fatalf("event %d %q: data %q, want %q", i, e.raw, e.data, want)
		}
	}
	if tail := input[pos:]; len(bytes.TrimSpace(tail)) != 0 {
		t.Fatalf("input after the last event was dropped: %q", tail)
	}
}

func FuzzEventReader(f *testing.F) {
	for _, s := range []string{
		chat, string(chatStream(3)),
		"data: {\"a\":1}\r\n\r\ndata: [DONE]\r\n\r\n",
		": keep-alive\n\ndata: x\n\n", "data: a\n: ping\ndata: b\n\n",
		"data:a\n\ndata:  a\n\ndata:\n\n", "event: error\nid: 7\ndata: {}\n\n",
		"\n\r\n\ndata: a\n\n\n\n", "data: a\r\r\n\r\r\ndata: b\n\n", " \ndata: a\n\n",
		"data: a\n\ndata: {\"choices\":[{\"del", "data: a\ndata: b\nid: 5", "data: a\n\r", ": ping",
		"data: x\n\n  \t", "data: [DONE]\n", "data: \x00\xff\n\n", "data\n\n", "\r", "",
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(5))
	}
	f.Fuzz(func(t *testing.T, input []byte, split uint8) {
		evs := readEvents(t, bytes.NewReader(input))
		checkEvents(t, input, evs)
		// The same events however the body arrives.
		for _, r := range []io.Reader{
			iotest.OneByteReader(bytes.NewReader(input)),
			&chunkReader{r: bytes.NewReader(input), n: int(split%16) + 1},
		} {
			if got := readEvents(t, r); !eventsEqual(got, evs) {
				t.Fatalf("split reads give %v, one read %v", got, evs)
			}
		}
	})
}
