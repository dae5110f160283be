package tokens

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"strconv"
	"strings"
)

// Function definitions are not sent to the model as JSON: OpenAI renders
// them as a TypeScript namespace in the system message (the format first
// reverse-engineered by hmarr/openai-chat-tokens and matched by the OpenAI
// cookbook's counted examples):
//
//	namespace functions {
//
//	// Get the current weather
//	type get_weather = (_: {
//	// The city
//	location: string,
//	unit?: "celsius" | "fahrenheit",
//	}) => any;
//
//	} // namespace functions
//
// The block costs its tokens plus 9, or 4 fewer when the request has a
// system message for it to join (which then ends in a newline, see Chat).
const (
	tokensPerFunctionsBlock = 9
	tokensSavedBySystemJoin = 4
	maxSchemaDepth          = 16   // nesting rendered before falling back to "any"
	maxFunctionsRendered    = 1024 // functions rendered; the rest count as raw JSON
)

// toolSet is a parsed "tools" (or legacy "functions") value.
type toolSet struct {
	fns []functionDef
	raw []string // tools that are not functions, counted as their JSON
}

type functionDef struct {
	name, description string
	params            object
}

func parseTools(raw json.RawMessage) toolSet {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return toolSet{}
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return toolSet{raw: []string{string(raw)}}
	}
	if len(items) == 0 {
		return toolSet{}
	}
	var ts toolSet
	for _, item := range items {
		v, ok := decodeOrdered(item)
		o, isObj := v.(object)
		if ok && isObj && len(ts.fns) < maxFunctionsRendered {
			if f, ok := o.get("function"); ok { // {"type":"function","function":{...}}
				o, _ = f.(object)
			}
			if name := o.str("name"); name != "" {
				fd := functionDef{name: name, description: o.str("description")}
				fd.params, _ = o.val("parameters").(object)
				ts.fns = append(ts.fns, fd)
				continue
			}
		}
		ts.raw = append(ts.raw, string(item))
	}
	return ts
}

// toolsTokens counts a "tools" value: the rendered functions plus the JSON
// of anything else. An application sends the same tools with every request,
// so the count is memoised by the raw value's hash.
func toolsTokens(enc *encoding, raw json.RawMessage, hasSystem bool) int {
	h := maphash.Bytes(memoSeed, raw)
	packed, ok := memoGet(enc, memoTools, h, len(raw))
	if !ok {
		ts := parseTools(raw)
		packed = ts.count(enc) << 1
		if len(ts.fns) > 0 {
			packed |= 1
		}
		memoPut(enc, memoTools, h, len(raw), packed)
	}
	n, hasFunctions := packed>>1, packed&1 == 1
	if hasSystem && hasFunctions {
		n -= tokensSavedBySystemJoin
	}
	return n
}

// hasTools reports whether a "tools" value is more than absent, null or [].
func hasTools(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return false
	}
	if raw[0] == '[' {
		return !bytes.Equal(bytes.TrimSpace(raw[1:]), []byte("]"))
	}
	return true
}

func (ts *toolSet) count(enc *encoding) int {
	n := 0
	for _, r := range ts.raw {
		n += enc.count(r)
	}
	if len(ts.fns) > 0 {
		n += enc.count(renderFunctions(ts.fns)) + tokensPerFunctionsBlock
	}
	return n
}

// renderFunctions writes fns the way OpenAI shows them to the model.
func renderFunctions(fns []functionDef) string {
	var b strings.Builder
	b.WriteString("namespace functions {\n\n")
	for _, f := range fns {
		// Descriptions are trimmed: for a recorded request with docstring
		// descriptions ("...\n    ") that is closer to what was billed.
		if d := strings.TrimSpace(f.description); d != "" {
			b.WriteString("// ")
			b.WriteString(d)
			b.WriteByte('\n')
		}
		b.WriteString("type ")
		b.WriteString(f.name)
		if props, _ := f.params.val("properties").(object); len(props) > 0 {
			b.WriteString(" = (_: {\n")
			writeProperties(&b, f.params, props, 0, 0)
			b.WriteString("}) => any;\n\n")
		} else {
			b.WriteString(" = () => any;\n\n")
		}
	}
	b.WriteString("} // namespace functions")
	return b.String()
}

func writeProperties(b *strings.Builder, schema, props object, indent, depth int) {
	required, _ := schema.val("required").([]any)
	for _, p := range props {
		ps, _ := p.val.(object)
		if d := strings.TrimSpace(ps.str("description")); d != "" {
			writeIndent(b, indent)
			b.WriteString("// ")
			b.WriteString(d)
			b.WriteByte('\n')
		}
		writeIndent(b, indent)
		b.WriteString(p.key)
		if !contains(required, p.key) {
			b.WriteByte('?')
		}
		b.WriteString(": ")
		writeType(b, ps, indent, depth+1)
		b.WriteString(",\n")
	}
}

func writeIndent(b *strings.Builder, n int) {
	for range n {
		b.WriteByte(' ')
	}
}

func contains(list []any, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// writeType writes a JSON Schema as a TypeScript type.
func writeType(b *strings.Builder, s object, indent, depth int) {
	if depth > maxSchemaDepth {
		b.WriteString("any")
		return
	}
	if e, _ := s.val("enum").([]any); len(e) > 0 {
		writeUnion(b, e, writeLiteral)
		return
	}
	if c, ok := s.get("const"); ok {
		writeLiteral(b, c)
		return
	}
	for _, k := range [...]string{"anyOf", "oneOf"} {
		if alts, _ := s.val(k).([]any); len(alts) > 0 {
			writeUnion(b, alts, func(b *strings.Builder, v any) {
				alt, _ := v.(object)
				writeType(b, alt, indent, depth+1)
			})
			return
		}
	}
	switch t := s.val("type").(type) {
	case string:
		writeNamedType(b, s, t, indent, depth)
	case []any: // ["string", "null"]
		writeUnion(b, t, func(b *strings.Builder, v any) {
			name, _ := v.(string)
			writeNamedType(b, s, name, indent, depth)
		})
	default:
		b.WriteString("any")
	}
}

func writeNamedType(b *strings.Builder, s object, t string, indent, depth int) {
	switch t {
	case "string", "boolean", "null":
		b.WriteString(t)
	case "number", "integer":
		b.WriteString("number")
	case "object":
		props, _ := s.val("properties").(object)
		if len(props) == 0 {
			b.WriteString("object")
			return
		}
		b.WriteString("{\n")
		writeProperties(b, s, props, indent+2, depth)
		writeIndent(b, indent)
		b.WriteByte('}')
	case "array":
		items, ok := s.val("items").(object)
		if !ok {
			b.WriteString("any[]")
			return
		}
		writeType(b, items, indent, depth+1)
		b.WriteString("[]")
	default:
		b.WriteString("any")
	}
}

func writeUnion(b *strings.Builder, vs []any, write func(*strings.Builder, any)) {
	for i, v := range vs {
		if i > 0 {
			b.WriteString(" | ")
		}
		write(b, v)
	}
}

func writeLiteral(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(strconv.Quote(v))
	case json.Number:
		b.WriteString(v.String())
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	default:
		b.WriteString("any")
	}
}

// object is a JSON object with its members in document order: OpenAI
// renders parameters in the order they were sent.
type object []member

type member struct {
	key string
	val any
}

func (o object) get(key string) (any, bool) {
	for _, m := range o {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

func (o object) val(key string) any {
	v, _ := o.get(key)
	return v
}

func (o object) str(key string) string {
	s, _ := o.val(key).(string)
	return s
}

// maxJSONDepth bounds the recursion of decodeOrdered.
const maxJSONDepth = 64

// decodeOrdered decodes one JSON value into string, json.Number, bool, nil,
// []any and object values. It reports false for anything that is not a
// single valid JSON value nested at most maxJSONDepth deep.
func decodeOrdered(data []byte) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, ok := decodeValue(dec, 0)
	if !ok || dec.More() {
		return nil, false
	}
	if _, err := dec.Token(); err == nil {
		return nil, false // trailing data
	}
	return v, true
}

func decodeValue(dec *json.Decoder, depth int) (any, bool) {
	if depth > maxJSONDepth {
		return nil, false
	}
	t, err := dec.Token()
	if err != nil {
		return nil, false
	}
	d, isDelim := t.(json.Delim)
	if !isDelim {
		return t, true
	}
	switch d {
	case '{':
		o := object{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, false
			}
			k, _ := kt.(string)
			v, ok := decodeValue(dec, depth+1)
			if !ok {
				return nil, false
			}
			o = append(o, member{k, v})
		}
		_, err := dec.Token()
		return o, err == nil
	case '[':
		a := []any{}
		for dec.More() {
			v, ok := decodeValue(dec, depth+1)
			if !ok {
				return nil, false
			}
			a = append(a, v)
		}
		_, err := dec.Token()
		return a, err == nil
	}
	return nil, false
}
