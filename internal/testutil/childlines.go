package testutil

// Lines returns the channel of the child's protocol lines (see Say), closed
// when the child's output ends: for a parent that watches several children
// at once. Use it or Line, not both.
func (c *Child) Lines() <-chan string { return c.lines }
