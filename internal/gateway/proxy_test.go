package gateway

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/iotest"
)

func TestReadAnswer(t *testing.T) {
	answer := []byte(`{"id":"chatcmpl-1","usage":{"prompt_tokens":3}}`)
	n := int64(len(answer))
	cases := []struct {
		name    string
		body    io.Reader
		length  int64
		want    []byte
		wantErr bool
	}{
		{"announced length", bytes.NewReader(answer), n, answer, false},
		{"in small reads", iotest.OneByteReader(bytes.NewReader(answer)), n, answer, false},
		{"unknown length", bytes.NewReader(answer), -1, answer, false},
		{"empty", bytes.NewReader(nil), 0, []byte{}, false},
		{"shorter than announced", bytes.NewReader(answer[:10]), n, nil, true},
		{"longer than announced", bytes.NewReader(answer), n - 5, answer, false},
		{"a read error", iotest.ErrReader(errors.New("connection reset")), n, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAnswer(&http.Response{Body: io.NopCloser(tc.body), ContentLength: tc.length})
			if (err != nil) != tc.wantErr {
				t.Fatalf("readAnswer: error %v; want one: %v", err, tc.wantErr)
			}
			if !tc.wantErr && !bytes.Equal(got, tc.want) {
				t.Fatalf("readAnswer = %q; want %q", got, tc.want)
			}
		})
	}
}
