package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Limits are rate and concurrency limits; 0 means no limit.
type Limits struct {
	// RPM is requests per minute.
	RPM int64 `yaml:"rpm"`
	// TPM is tokens (prompt plus completion) per minute.
	TPM int64 `yaml:"tpm"`
	// Concurrency is requests in flight at once.
	Concurrency int64 `yaml:"concurrency"`
	// ITPM and OTPM are input (prompt) and output (completion) tokens per
	// minute, as Anthropic sets its limits.
	ITPM int64 `yaml:"itpm"`
	OTPM int64 `yaml:"otpm"`

	// set records which fields the YAML wrote, so that a model_limits
	// entry can lift a limit by writing 0. Values built in Go leave it
	// zero (see Override).
	set limitField
}

// limitField is a bit set of Limits fields.
type limitField uint8

const (
	fieldRPM limitField = 1 << iota
	fieldTPM
	fieldConcurrency
	fieldITPM
	fieldOTPM
)

// limitKeys maps YAML keys to their field, in the order messages list them.
var limitKeys = []struct {
	key string
	bit limitField
	get func(*Limits) *int64
}{
	{"rpm", fieldRPM, func(l *Limits) *int64 { return &l.RPM }},
	{"tpm", fieldTPM, func(l *Limits) *int64 { return &l.TPM }},
	{"concurrency", fieldConcurrency, func(l *Limits) *int64 { return &l.Concurrency }},
	{"itpm", fieldITPM, func(l *Limits) *int64 { return &l.ITPM }},
	{"otpm", fieldOTPM, func(l *Limits) *int64 { return &l.OTPM }},
}

// Override returns l with the fields that o sets replaced by o's values. A
// field counts as set when o was read from YAML that wrote it (0 included,
// which lifts the limit); in a Limits built in Go, when it is not zero.
func (l Limits) Override(o Limits) Limits {
	set := o.set
	if set == 0 {
		for _, k := range limitKeys {
			if *k.get(&o) != 0 {
				set |= k.bit
			}
		}
	}
	for _, k := range limitKeys {
		if set&k.bit != 0 {
			*k.get(&l) = *k.get(&o)
		}
	}
	l.set = 0
	return l
}

// plain returns l without its record of which fields were written, so that
// it compares equal to a literal with the same limits.
func (l Limits) plain() Limits {
	l.set = 0
	return l
}

// UnmarshalYAML reads a mapping of rpm, tpm and concurrency, remembering
// which were written. It is written out by hand because a yaml.Node decoded
// on its own loses the decoder's KnownFields check; its messages use the
// decoder's wording so that they are rewritten like the others.
func (l *Limits) UnmarshalYAML(n *yaml.Node) error {
	n = deref(n)
	if n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s into config.Limits", n.Line, n.ShortTag())}}
	}
	out := *l
	var errs []string
	var written limitField
	read := func(k, v *yaml.Node, merged bool) {
		i := limitIndex(k.Value)
		switch {
		case i < 0:
			errs = append(errs, fmt.Sprintf("line %d: field %s not found in type config.Limits", k.Line, k.Value))
			return
		case written&limitKeys[i].bit != 0:
			if !merged { // a key written explicitly wins over a merged one
				errs = append(errs, fmt.Sprintf("line %d: field %s already set in type config.Limits", k.Line, k.Value))
			}
			return
		}
		written |= limitKeys[i].bit
		v = deref(v)
		switch v.ShortTag() {
		case "!!null":
			return
		case "!!int":
			if err := v.Decode(limitKeys[i].get(&out)); err != nil {
				errs = append(errs, fmt.Sprintf("line %d: cannot unmarshal !!int `%s` into int64", v.Line, v.Value))
				return
			}
			out.set |= limitKeys[i].bit
		default:
			errs = append(errs, fmt.Sprintf("line %d: cannot unmarshal %s `%s` into int64", v.Line, v.ShortTag(), v.Value))
		}
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		read(k, v, false)
	}
	// YAML merge keys ("<<: *std"): explicit keys win, then earlier merged
	// mappings over later ones. One level only, which is all limits need.
	for _, m := range merges {
		m = deref(m)
		list := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			list = m.Content
		}
		for _, mm := range list {
			mm = deref(mm)
			if mm.Kind != yaml.MappingNode {
				errs = append(errs, fmt.Sprintf("line %d: cannot unmarshal %s into config.Limits", mm.Line, mm.ShortTag()))
				continue
			}
			for i := 0; i+1 < len(mm.Content); i += 2 {
				k := mm.Content[i]
				if k.Value == "<<" {
					errs = append(errs, fmt.Sprintf("line %d: nested merge keys (<<) are not supported in limits; write the limits out", k.Line))
					continue
				}
				read(k, mm.Content[i+1], true)
			}
		}
	}
	if len(errs) > 0 {
		return &yaml.TypeError{Errors: errs}
	}
	*l = out
	return nil
}

func limitIndex(key string) int {
	for i, k := range limitKeys {
		if k.key == key {
			return i
		}
	}
	return -1
}

// deref follows an alias ("*std") to its anchored node. An anchor cannot be
// put on an alias, so one step is enough.
func deref(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}
