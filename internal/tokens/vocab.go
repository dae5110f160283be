package tokens

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The vocabularies, OpenAI's o200k_base and cl100k_base token lists
// (github.com/openai/tiktoken, MIT licence) as github.com/tiktoken-go/tokenizer
// carries them. They are kept here in a compact form, written and checked
// against that module by TestVocabFiles, so that the binary holds no Go map
// of 300,000 strings: that module builds one per encoding at first use and
// keeps it for the life of the process, where every GC cycle marks it.
var (
	//go:embed vocab/o200k_base.gz
	o200kVocab []byte
	//go:embed vocab/cl100k_base.gz
	cl100kVocab []byte
)

// vocabMagic starts a vocabulary file (after gzip), followed by the
// encoding's name and a newline, then for each token ID from 0 its length
// as a uvarint and its bytes; length 0 marks an ID with no token.
const vocabMagic = "llmgate-vocab-1 "

// maxVocabBytes bounds what readVocab inflates.
const maxVocabBytes = 64 << 20

// readVocab decodes a vocabulary file of the named encoding into the
// tokens' bytes, end to end, and their offsets (token id is
// data[offs[id]:offs[id+1]]).
func readVocab(file []byte, name string) (data []byte, offs []uint32, err error) {
	zr, err := gzip.NewReader(bytes.NewReader(file))
	if err != nil {
		return nil, nil, fmt.Errorf("tokens: vocabulary %s: %w", name, err)
	}
	raw, err := io.ReadAll(io.LimitReader(zr, maxVocabBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("tokens: vocabulary %s: %w", name, err)
	}
	if len(raw) > maxVocabBytes {
		return nil, nil, fmt.Errorf("tokens: vocabulary %s: larger than %d bytes", name, maxVocabBytes)
	}
	head, body, ok := bytes.Cut(raw, []byte{'\n'})
	if !ok || string(head) != vocabMagic+name {
		return nil, nil, fmt.Errorf("tokens: vocabulary %s: not a vocabulary file of that encoding", name)
	}
	data = make([]byte, 0, len(body))
	offs = []uint32{0}
	for len(body) > 0 {
		n, w := binary.Uvarint(body)
		if w <= 0 || n > uint64(len(body)-w) {
			return nil, nil, fmt.Errorf("tokens: vocabulary %s: token %d is cut short", name, len(offs)-1)
		}
		data = append(data, body[w:w+int(n)]...)
		offs = append(offs, uint32(len(data)))
		body = body[w+int(n):]
	}
	if len(offs) == 1 {
		return nil, nil, errors.New("tokens: vocabulary " + name + ": no tokens")
	}
	return data, offs, nil
}

// writeVocab encodes tokens (indexed by ID, "" where an ID has none) as a
// vocabulary file of the named encoding.
func writeVocab(w io.Writer, name string, tokens []string) error {
	if strings.ContainsRune(name, '\n') {
		return errors.New("tokens: vocabulary name with a newline")
	}
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	buf := []byte(vocabMagic + name + "\n")
	for _, t := range tokens {
		buf = binary.AppendUvarint(buf, uint64(len(t)))
		buf = append(buf, t...)
	}
	if _, err := zw.Write(buf); err != nil {
		return err
	}
	return zw.Close()
}
