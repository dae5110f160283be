package gateway

import "slices"

// tenantIndex is the tenants in force: replaced whole (SetTenants), read
// by every request without a lock.
type tenantIndex struct {
	byKey map[string]*Tenant // key hash -> tenant
	list  []*Tenant          // by name; [anonymous] when byKey is empty
}

func newTenantIndex(byKey map[string]*Tenant) *tenantIndex {
	ix := &tenantIndex{byKey: byKey}
	for _, t := range byKey {
		if !slices.Contains(ix.list, t) {
			ix.list = append(ix.list, t)
		}
	}
	slices.SortFunc(ix.list, func(a, b *Tenant) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	if len(ix.list) == 0 {
		ix.list = []*Tenant{anonymous}
	}
	return ix
}

// SetTenants replaces the tenants: byKey maps the lowercase hex SHA-256 of
// each API key to its tenant (as Options.Tenants; empty means open
// access). Requests authenticated from now on see them; the map must not
// be changed afterwards.
func (g *Gateway) SetTenants(byKey map[string]*Tenant) {
	g.tenants.Store(newTenantIndex(byKey))
}
