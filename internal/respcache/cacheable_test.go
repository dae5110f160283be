package respcache_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/llmgate/llmgate/internal/openai"
	"github.com/llmgate/llmgate/internal/respcache"
)

func readAnswer(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "answers", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// splitEvents cuts an SSE transcript into events the way the gateway does
// while relaying a stream: each event's raw bytes, framing included, and a
// partial last event when the body stops inside one.
func splitEvents(t testing.TB, transcript []byte) [][]byte {
	t.Helper()
	r := openai.NewEventReader(bytes.NewReader(transcript))
	var events [][]byte
	for {
		raw, _, err := r.Next()
		if len(raw) > 0 {
			events = append(events, bytes.Clone(raw))
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return events
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestCacheableAnswers(t *testing.T) {
	for _, tc := range []struct {
		file        string
		status      int
		want        bool // with allowLength false
		wantAllowed bool // with allowLength true
	}{
		{"chat_stop.json", 200, true, true},
		{"chat_stop.json", 201, true, true},
		{"chat_stop.json", 500, false, false},
		{"chat_stop.json", 304, false, false},
		{"chat_stop.json", 199, false, false},
		{"chat_tool_calls.json", 200, true, true},
		{"chat_length.json", 200, false, true},
		{"chat_n2_stop.json", 200, true, true},
		{"chat_n2_one_length.json", 200, false, true},
		{"chat_no_finish_reason.json", 200, false, false},
		{"chat_no_choices.json", 200, false, false},
		{"completion_stop.json", 200, true, true},
		{"completion_length.json", 200, false, true},
		{"embeddings.json", 200, true, true},
		{"embeddings.json", 400, false, false},
		{"error_rate_limit.json", 429, false, false},
		{"error_rate_limit.json", 200, false, false}, // an error dressed as a success
		{"error_server.json", 500, false, false},
		{"error_server.json", 200, false, false},
	} {
		e := &respcache.Entry{Status: tc.status, Body: readAnswer(t, tc.file)}
		if got := respcache.Cacheable(e, false); got != tc.want {
			t.Errorf("%s %d: Cacheable = %v, want %v", tc.file, tc.status, got, tc.want)
		}
		if got := respcache.Cacheable(e, true); got != tc.wantAllowed {
			t.Errorf("%s %d: Cacheable(allowLength) = %v, want %v", tc.file, tc.status, got, tc.wantAllowed)
		}
	}
}

func TestCacheableStreams(t *testing.T) {
	for _, tc := range []struct {
		file        string
		want        bool // with allowLength false
		wantAllowed bool // with allowLength true
	}{
		{"chat_stop.sse", true, true},
		{"chat_crlf.sse", true, true},
		{"chat_comments.sse", true, true},
		{"chat_include_usage.sse", true, true},
		{"azure_stop.sse", true, true},
		{"completion_stop.sse", true, true},
		{"chat_n2_stop.sse", true, true},
		{"chat_length.sse", false, true},
		{"chat_n2_one_length.sse", false, true},
		{"chat_n2_unfinished.sse", false, false},
		{"chat_no_done.sse", false, false},
		{"chat_finish_no_done.sse", false, false},
		{"chat_error_chunk.sse", false, false},
		{"chat_event_error.sse", false, false},
		{"chat_data_after_done.sse", false, false},
		{"only_done.sse", false, false},
	} {
		events := splitEvents(t, readAnswer(t, tc.file))
		e := &respcache.Entry{Status: 200, Events: events}
		if got := respcache.Cacheable(e, false); got != tc.want {
			t.Errorf("%s: Cacheable = %v, want %v", tc.file, got, tc.want)
		}
		if got := respcache.Cacheable(e, true); got != tc.wantAllowed {
			t.Errorf("%s: Cacheable(allowLength) = %v, want %v", tc.file, got, tc.wantAllowed)
		}
		e.Status = 502
		if respcache.Cacheable(e, true) {
			t.Errorf("%s: cacheable with status 502", tc.file)
		}
	}
}

func TestCacheableShapes(t *testing.T) {
	stop := readAnswer(t, "chat_stop.json")
	stream := splitEvents(t, readAnswer(t, "chat_stop.sse"))
	for name, tc := range map[string]struct {
		e    *respcache.Entry
		want bool
	}{
		"nil":                     {nil, false},
		"neither body nor events": {&respcache.Entry{Status: 200}, false},
		"empty events":            {&respcache.Entry{Status: 200, Events: [][]byte{}}, false},
		"body and events":         {&respcache.Entry{Status: 200, Body: stop, Events: stream}, false},
		"empty body":              {&respcache.Entry{Status: 200, Body: []byte{}}, false},
		"not JSON":                {&respcache.Entry{Status: 200, Body: []byte("<html>")}, false},
		"unknown shape":           {&respcache.Entry{Status: 200, Body: []byte(`{"object":"response","status":"completed"}`)}, false},
		"list without data array": {&respcache.Entry{Status: 200, Body: []byte(`{"object":"list","data":null}`)}, false},
		"error null":              {&respcache.Entry{Status: 200, Body: []byte(`{"error":null,"choices":[{"index":0,"finish_reason":"stop"}]}`)}, true},
		"empty finish_reason":     {&respcache.Entry{Status: 200, Body: []byte(`{"choices":[{"index":0,"finish_reason":""}]}`)}, false},
		"content_filter":          {&respcache.Entry{Status: 200, Body: []byte(`{"choices":[{"index":0,"finish_reason":"content_filter"}]}`)}, true},
		"choice index too large": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte(`data: {"choices":[{"index":5000,"finish_reason":"stop"}]}` + "\n\n"), []byte("data: [DONE]\n\n")}}, false},
		"negative choice index": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte(`data: {"choices":[{"index":-1,"finish_reason":"stop"}]}` + "\n\n"), []byte("data: [DONE]\n\n")}}, false},
		"a choice finished twice": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte(`data: {"choices":[{"index":0,"finish_reason":"stop"}]}` + "\n\n"),
			[]byte(`data: {"choices":[{"index":0,"finish_reason":"stop"}]}` + "\n\n"), []byte("data: [DONE]\n\n")}}, false},
		"multi-line data": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte("data: {\"choices\":\ndata: [{\"index\":0,\"finish_reason\":\"stop\"}]}\n\n"), []byte("data:[DONE]\n\n")}}, true},
		"CR line ends": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte("data: {\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}\r\r"), []byte("data: [DONE]\r\r")}}, true},
		"chunk not JSON": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte("data: {\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}\n\n"), []byte("data: oops\n\n"), []byte("data: [DONE]\n\n")}}, false},
		"[DONE] with spaces is not [DONE]": {&respcache.Entry{Status: 200, Events: [][]byte{
			[]byte("data: {\"choices\":[{\"index\":0,\"finish_reason\":\"stop\"}]}\n\n"), []byte("data: [DONE] \n\n")}}, false},
		"event: error without data": {&respcache.Entry{Status: 200, Events: append(append([][]byte{}, stream...), []byte("event: error\n\n"))}, false},
	} {
		if got := respcache.Cacheable(tc.e, false); got != tc.want {
			t.Errorf("%s: Cacheable = %v, want %v", name, got, tc.want)
		}
	}
}

// FuzzCacheable feeds arbitrary entries to Cacheable: it never panics, never
// accepts a non-2xx status, accepts a stream only if its last event with
// data is [DONE], and allowing length-cut answers only ever adds to what is
// cacheable.
func FuzzCacheable(f *testing.F) {
	for _, name := range []string{"chat_stop.sse", "chat_n2_stop.sse", "chat_error_chunk.sse", "chat_crlf.sse"} {
		f.Add(200, false, readAnswer(f, name), true)
	}
	for _, name := range []string{"chat_stop.json", "embeddings.json", "error_server.json"} {
		f.Add(200, true, readAnswer(f, name), false)
	}
	f.Fuzz(func(t *testing.T, status int, isBody bool, raw []byte, allowLength bool) {
		e := &respcache.Entry{Status: status}
		if isBody {
			e.Body = raw
		} else {
			e.Events = bytes.SplitAfter(raw, []byte("\n\n"))
		}
		ok := respcache.Cacheable(e, allowLength)
		if ok && (status < 200 || status > 299) {
			t.Fatalf("cacheable with status %d", status)
		}
		if ok && !allowLength && !respcache.Cacheable(e, true) {
			t.Fatal("cacheable, but not when answers cut by length are allowed too")
		}
		if ok && !isBody {
			last := ""
			for _, ev := range e.Events {
				for line := range strings.SplitSeq(strings.ReplaceAll(string(ev), "\r", "\n"), "\n") {
					if strings.HasPrefix(line, "data:") {
						last = strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")
					}
				}
			}
			if last != "[DONE]" {
				t.Fatalf("a stream whose last data is %q is cacheable", last)
			}
		}
	})
}
