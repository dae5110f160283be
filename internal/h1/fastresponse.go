package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
)

// readFastResponse reads the common response (HTTP/1.x, a final status,
// a Content-Length body, a header that arrived whole) with fewer
// allocations than http.ReadResponse: the header lines become one string,
// their values share one slice, the map is made to size. Anything else it
// leaves unread and reports false, and the caller uses http.ReadResponse:
// so what it accepts, it must read exactly as http.ReadResponse would
// (FuzzFastResponse holds it to that).
func readFastResponse(br *bufio.Reader, req *http.Request) (*http.Response, bool) {
	if _, err := br.Peek(1); err != nil {
		return nil, false
	}
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, false // the header is still coming
	}
	block := string(buf[:end+2]) // every line with its CRLF
	resp, ok := parseFastResponse(block, req)
	if !ok {
		return nil, false
	}
	_, _ = br.Discard(end + 4)
	if resp.ContentLength > 0 {
		resp.Body = &lengthBody{r: br, left: resp.ContentLength}
	} else {
		resp.Body = http.NoBody
	}
	return resp, true
}

// parseFastResponse parses a status line and header lines, each ending in
// CRLF, or reports false for what it leaves to http.ReadResponse.
func parseFastResponse(block string, req *http.Request) (*http.Response, bool) {
	if req != nil && req.Method == http.MethodHead {
		return nil, false
	}
	n := strings.Count(block, "\r\n")
	if strings.Count(block, "\n") != n || strings.Count(block, "\r") != n {
		return nil, false // a bare CR or LF: lines as textproto splits them
	}
	n-- // the status line
	line, rest, _ := strings.Cut(block, "\r\n")
	proto, status, ok := strings.Cut(line, " ")
	if !ok || (proto != "HTTP/1.1" && proto != "HTTP/1.0") || len(status) < 3 || (len(status) > 3 && status[3] != ' ') {
		return nil, false
	}
	code := 0
	for i := range 3 {
		if status[i] < '0' || status[i] > '9' {
			return nil, false
		}
		code = code*10 + int(status[i]-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil, false // no body by rule, or an informational answer
	}
	h := make(http.Header, n)
	values := make([]string, n)
	for i := 0; rest != ""; i++ {
		line, rest, _ = strings.Cut(rest, "\r\n")
		key, value, err := ParseField(line)
		if err != nil {
			return nil, false // also a continuation line, which starts with a space
		}
		switch key {
		case "Transfer-Encoding", "Trailer", "Pragma":
			return nil, false // framing, trailers, header rewriting: ReadResponse's
		case "Content-Length":
			if _, seen := h[key]; seen {
				return nil, false
			}
		}
		AddField(h, values, i, key, value)
	}
	cl := h["Content-Length"]
	if len(cl) != 1 {
		return nil, false // close-delimited: rare, and ReadResponse's
	}
	length, err := strconv.ParseUint(cl[0], 10, 63)
	if err != nil {
		return nil, false
	}
	resp := &http.Response{
		Status: strings.TrimLeft(status, " "), StatusCode: code, Proto: proto,
		ProtoMajor: 1, ProtoMinor: 1, Header: h, ContentLength: int64(length), Request: req,
	}
	// Keep-alive as ReadResponse decides it (net/http's shouldClose).
	conn := h["Connection"]
	hasClose := containsToken(conn, "close")
	if proto == "HTTP/1.0" {
		resp.ProtoMinor = 0
		resp.Close = hasClose || !containsToken(conn, "keep-alive")
	} else if hasClose {
		resp.Close = true
		delete(h, "Connection")
	}
	return resp, true
}

// containsToken reports whether the comma-separated values hold token,
// ASCII letters in any case (not Unicode folding: "cloſe" is not "close").
func containsToken(values []string, token string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			if asciiEqualFold(strings.Trim(part, " \t"), token) {
				return true
			}
		}
	}
	return false
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// Errors of ParseField.
var (
	ErrFieldLine  = errors.New("malformed header line")
	ErrFieldValue = errors.New("invalid character in a header value")
)

// ParseField splits a header line "Name: value" (without its line end)
// into its canonical name and its value without surrounding blanks, or
// fails with ErrFieldLine (no colon, a name that is not a token) or
// ErrFieldValue (a control character in the value).
func ParseField(line string) (key, value string, err error) {
	name, value, ok := strings.Cut(line, ":")
	if !ok || !ValidToken(name) {
		return "", "", ErrFieldLine
	}
	value = strings.Trim(value, " \t")
	if !ValidValue(value) {
		return "", "", ErrFieldValue
	}
	return textproto.CanonicalMIMEHeaderKey(name), value, nil
}

// Get is h.Get(key) for a key already in canonical form (a constant such
// as "X-Request-Id"): it skips the canonicalization Get does on every call,
// a scan of the key that shows in the gateway's profile at ~20 lookups a
// request.
func Get(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// AddField adds the value of header line i to h. A name's first value is
// a slice of values (one slot per line, made by the caller) so that a
// header of n lines costs one slice, not n.
func AddField(h http.Header, values []string, i int, key, value string) {
	if vs, seen := h[key]; seen {
		h[key] = append(vs, value)
		return
	}
	values[i] = value
	h[key] = values[i : i+1 : i+1]
}

// lengthBody is a Content-Length body; it reports io.EOF with its last
// bytes, so that the connection is given back without another read.
type lengthBody struct {
	r    io.Reader
	left int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	switch {
	case b.left == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *lengthBody) Close() error { return nil }
