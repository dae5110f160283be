package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// MaxEventBytes bounds one server-sent event; a provider's chunks are a few
// hundred bytes, so anything near this is a broken stream, not an answer.
const MaxEventBytes = 8 << 20

// ErrEventTooLarge is returned for an event over MaxEventBytes.
var ErrEventTooLarge = errors.New("openai: stream event too large")

// EventReader splits a text/event-stream body into events, keeping each
// event's bytes exactly as received so they can be forwarded unchanged.
type EventReader struct {
	r     *bufio.Reader
	event []byte // the event being read: raw lines, terminators included
	data  []byte // its data lines joined with "\n"
}

// NewEventReader reads events from r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{r: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event: raw is its bytes up to and including the
// blank line that ends it, data its "data:" payload (nil for comments and
// events without data). Both are valid until the next call. At the end of the
// body it returns io.EOF; a body that stops inside an event returns the
// partial event with io.ErrUnexpectedEOF.
func (e *EventReader) Next() (raw, data []byte, err error) {
	e.event, e.data = e.event[:0], e.data[:0]
	hasData := false
	for {
		start := len(e.event)
		line, err := e.r.ReadSlice('\n')
		for errors.Is(err, bufio.ErrBufferFull) {
			e.event = append(e.event, line...)
			if len(e.event) > MaxEventBytes {
				return nil, nil, ErrEventTooLarge
			}
			line, err = e.r.ReadSlice('\n')
		}
		e.event = append(e.event, line...)
		if len(e.event) > MaxEventBytes {
			return nil, nil, ErrEventTooLarge
		}
		full := e.event[start:]
		if err != nil {
			if err != io.EOF {
				return e.event, e.dataOrNil(hasData), fmt.Errorf("openai: reading stream: %w", err)
			}
			if len(bytes.TrimSpace(e.event)) == 0 {
				return nil, nil, io.EOF
			}
			// The body ended without the blank line that closes an event.
			// Only a partial "data:" line adds to the payload (full may be
			// empty, or another field, after complete data lines).
			if bytes.HasPrefix(full, []byte("data:")) {
				hasData = e.addData(full, hasData)
			}
			return e.event, e.dataOrNil(hasData), io.ErrUnexpectedEOF
		}
		content := bytes.TrimRight(full, "\r\n")
		if len(content) == 0 {
			if len(e.event) == len(full) {
				e.event = e.event[:0] // blank lines between events: skip them
				continue
			}
			return e.event, e.dataOrNil(hasData), nil
		}
		if bytes.HasPrefix(content, []byte("data:")) {
			hasData = e.addData(content, hasData)
		}
	}
}

// addData appends the payload of a "data:" line to e.data.
func (e *EventReader) addData(line []byte, hasData bool) bool {
	line = bytes.TrimRight(line, "\r\n")
	v := line[len("data:"):]
	if len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	if hasData {
		e.data = append(e.data, '\n')
	}
	e.data = append(e.data, v...)
	return true
}

func (e *EventReader) dataOrNil(hasData bool) []byte {
	if !hasData {
		return nil
	}
	if e.data == nil {
		return []byte{} // only empty "data:" lines, before e.data had to grow
	}
	return e.data
}
