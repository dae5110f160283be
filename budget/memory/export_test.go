package memory

// SetBeforeWrite makes b call f before each write of its state file (after
// taking the snapshot the write will contain). Set it before any Settle.
func SetBeforeWrite(b *Backend, f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.beforeWrite = f
}
