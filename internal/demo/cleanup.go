package demo

import (
	"fmt"

	"github.com/overlay-plugin/overlay-plugin/internal/testbed"
)

// cleanup stops the plugins, then lets the Bed remove the rest (newest
// first: namespaces, whose leftover processes it kills by PID, and the
// scratch directory), and says what it did.
func (r *run) cleanup() error {
	r.out.step("Cleaning up")
	r.stopPlugins()
	namespaces, _ := testbed.Namespaces()
	if err := r.bed.Cleanup(); err != nil {
		r.out.say("%s", r.out.paint(red, "cleanup: "+err.Error()))
		return fmt.Errorf("cleanup: %w", err)
	}
	r.out.say("deleted %d namespaces", len(namespaces))
	r.out.say("removed %s", r.bed.Dir())
	return nil
}
