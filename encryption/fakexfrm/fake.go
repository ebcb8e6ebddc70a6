// Package fakexfrm is an in-memory encryption.XFRM for tests: it keeps the
// states and policies the netlink implementation would install, with the
// same rules, and can fail any operation or play a kernel without ESP.
package fakexfrm

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/overlay-plugin/overlay-plugin/encryption"
)

// Operation names passed to an XFRM's fault function.
const (
	OpCheck        = "Check"
	OpAddSA        = "AddSA"
	OpDeleteSA     = "DeleteSA"
	OpSetPolicy    = "SetPolicy"
	OpBlockPolicy  = "BlockPolicy"
	OpDeletePolicy = "DeletePolicy"
	OpStates       = "States"
	OpPolicies     = "Policies"
	OpFlush        = "Flush"
)

// XFRM is an in-memory encryption.XFRM. It applies the rules of the
// netlink implementation: states are identified by (dst, SPI), adding the
// same SA again is a no-op and a different SA under a used (dst, SPI) is an
// error; policies are identified by (src, dst, port) and replaced in place;
// deleting what is missing is fine. A fault function can fail any
// operation, and CheckErr simulates a kernel without ESP.
type XFRM struct {
	// CheckErr, when set, is what Check and AddSA return, as a kernel
	// lacking ESP or GCM would: set it to NoESPError() (or any error)
	// before the fake is shared, or later with SetCheckErr.
	CheckErr error

	// mu guards the fields below. Leaf lock: the fault function is called
	// with it held and must not call back into the fake.
	mu       sync.Mutex
	fault    func(op string) error
	states   map[stateKey]state
	policies map[policyKey]uint32 // SPI, 0 for a blocking policy
	ops      []string
}

type stateKey struct {
	dst netip.Addr
	spi uint32
}

type state struct {
	info encryption.StateInfo
	key  []byte
}

type policyKey struct {
	src, dst netip.Addr
	port     uint16
}

var _ encryption.XFRM = (*XFRM)(nil)

// New returns an empty fake that supports ESP.
func New() *XFRM {
	return &XFRM{
		states:   map[stateKey]state{},
		policies: map[policyKey]uint32{},
	}
}

// NoESPError is the error a kernel without ESP/GCM gives, for CheckErr.
func NoESPError() error {
	return fmt.Errorf("%w: load esp4/esp6 and gcm modules or use a kernel that has them: fake kernel", encryption.ErrNoESP)
}

// SetFault installs f, called with the operation's name (the Op*
// constants) before each operation; a non-nil result fails the operation
// with that error and changes nothing. nil removes the fault.
func (f *XFRM) SetFault(fn func(op string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fault = fn
}

// begin records op and consults the fault function. Called with mu held.
func (f *XFRM) begin(op string) error {
	f.ops = append(f.ops, op)
	if f.fault != nil {
		return f.fault(op)
	}
	return nil
}

// SetCheckErr sets CheckErr safely while other goroutines use the fake.
func (f *XFRM) SetCheckErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.CheckErr = err
}

// Ops returns the names of the operations called so far, in order.
func (f *XFRM) Ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ops)
}

// Key returns a copy of the key of state (dst, spi), if installed.
func (f *XFRM) Key(dst netip.Addr, spi uint32) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.states[stateKey{dst.Unmap(), spi}]
	return bytes.Clone(s.key), ok
}

// Count adds traffic to the counters of state (dst, spi), as the kernel
// would when packets use it. It reports whether the state exists.
func (f *XFRM) Count(dst netip.Addr, spi uint32, packets, bytes uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := stateKey{dst.Unmap(), spi}
	s, ok := f.states[k]
	if ok {
		s.info.Packets += packets
		s.info.Bytes += bytes
		f.states[k] = s
	}
	return ok
}

func pair(src, dst netip.Addr) (netip.Addr, netip.Addr, error) {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() {
		return src, dst, fmt.Errorf("xfrm: invalid address pair %v -> %v", src, dst)
	}
	if src.Is4() != dst.Is4() {
		return src, dst, fmt.Errorf("xfrm: address families differ: %v -> %v", src, dst)
	}
	return src, dst, nil
}

// Check returns CheckErr.
func (f *XFRM) Check() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpCheck); err != nil {
		return err
	}
	return f.CheckErr
}

// AddSA records sa.
func (f *XFRM) AddSA(sa encryption.SA) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpAddSA); err != nil {
		return err
	}
	if f.CheckErr != nil {
		return fmt.Errorf("xfrm: add SA %v spi %#x: %w", sa.Direction, sa.SPI, f.CheckErr)
	}
	src, dst, err := pair(sa.Src, sa.Dst)
	if err != nil {
		return err
	}
	if len(sa.Key) != encryption.KeyLen {
		return fmt.Errorf("xfrm: SA %v: key is %d bytes, want %d", sa.Direction, len(sa.Key), encryption.KeyLen)
	}
	if sa.SPI < 256 {
		return fmt.Errorf("xfrm: SA %v: SPI %#x is reserved", sa.Direction, sa.SPI)
	}
	k := stateKey{dst, sa.SPI}
	if old, ok := f.states[k]; ok {
		if old.info.Src != src || !bytes.Equal(old.key, sa.Key) {
			return fmt.Errorf("xfrm: SA %v: SPI %#x to %v is already used by another state (src %v)",
				sa.Direction, sa.SPI, dst, old.info.Src)
		}
		return nil
	}
	f.states[k] = state{info: encryption.StateInfo{Src: src, Dst: dst, SPI: sa.SPI}, key: bytes.Clone(sa.Key)}
	return nil
}

// DeleteSA forgets state (dst, spi) if its source is src.
func (f *XFRM) DeleteSA(src, dst netip.Addr, spi uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpDeleteSA); err != nil {
		return err
	}
	src, dst, err := pair(src, dst)
	if err != nil {
		return err
	}
	k := stateKey{dst, spi}
	if s, ok := f.states[k]; ok && s.info.Src == src {
		delete(f.states, k)
	}
	return nil
}

func (f *XFRM) setPolicy(op string, src, dst netip.Addr, port uint16, spi uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(op); err != nil {
		return err
	}
	src, dst, err := pair(src, dst)
	if err != nil {
		return err
	}
	if port == 0 {
		return errors.New("xfrm: policy needs a destination port")
	}
	f.policies[policyKey{src, dst, port}] = spi
	return nil
}

// SetPolicy records the policy src→dst:port with spi.
func (f *XFRM) SetPolicy(src, dst netip.Addr, port uint16, spi uint32) error {
	if spi == 0 {
		return errors.New("xfrm: SetPolicy needs an SPI (BlockPolicy blocks)")
	}
	return f.setPolicy(OpSetPolicy, src, dst, port, spi)
}

// BlockPolicy records the policy src→dst:port with SPI 0.
func (f *XFRM) BlockPolicy(src, dst netip.Addr, port uint16) error {
	return f.setPolicy(OpBlockPolicy, src, dst, port, 0)
}

// DeletePolicy forgets the policy src→dst:port.
func (f *XFRM) DeletePolicy(src, dst netip.Addr, port uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpDeletePolicy); err != nil {
		return err
	}
	src, dst, err := pair(src, dst)
	if err != nil {
		return err
	}
	delete(f.policies, policyKey{src, dst, port})
	return nil
}

// States lists the recorded states, sorted by destination then SPI.
func (f *XFRM) States() ([]encryption.StateInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpStates); err != nil {
		return nil, err
	}
	var out []encryption.StateInfo
	for _, s := range f.states {
		out = append(out, s.info)
	}
	slices.SortFunc(out, func(a, b encryption.StateInfo) int {
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c
		}
		return cmp.Compare(a.SPI, b.SPI)
	})
	return out, nil
}

// Policies lists the recorded policies, sorted by source, destination, port.
func (f *XFRM) Policies() ([]encryption.PolicyInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpPolicies); err != nil {
		return nil, err
	}
	var out []encryption.PolicyInfo
	for k, spi := range f.policies {
		out = append(out, encryption.PolicyInfo{Src: k.src, Dst: k.dst, Port: k.port, SPI: spi})
	}
	slices.SortFunc(out, func(a, b encryption.PolicyInfo) int {
		if c := a.Src.Compare(b.Src); c != 0 {
			return c
		}
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c
		}
		return cmp.Compare(a.Port, b.Port)
	})
	return out, nil
}

// Flush forgets every state and policy.
func (f *XFRM) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.begin(OpFlush); err != nil {
		return err
	}
	clear(f.states)
	clear(f.policies)
	return nil
}
