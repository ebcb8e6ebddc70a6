package testbed

import (
	"fmt"
	"net/netip"
	"time"
)

// Traffic is how CheckTraffic exercises the overlay between containers.
type Traffic struct {
	// FirstPing bounds the wait for each pair's first answer (neighbour
	// tables, and under IPsec the SAs, may need a moment).
	FirstPing time.Duration
	// TCPSize bytes go each way between every pair through an echo
	// server on EchoPort, within TCPTimeout; 0: ICMP only.
	TCPSize    int
	TCPTimeout time.Duration
	EchoPort   uint16
}

// CheckTraffic checks the overlay between every ordered pair of the
// containers, in each family the first one has an address of (every
// other must have one too): a bounded wait for the first ICMP answer,
// then three that must all answer; with TCPSize, an exchange with an echo
// server in every container from every other.
func CheckTraffic(ctrs []*Container, tr Traffic) error {
	for _, fam := range []Family{IPv4, IPv6} {
		if len(ctrs) == 0 {
			break
		}
		if _, ok := ctrs[0].Addr(fam); !ok {
			continue
		}
		dsts := make([]netip.Addr, len(ctrs))
		for i, b := range ctrs {
			var ok bool
			if dsts[i], ok = b.Addr(fam); !ok {
				return fmt.Errorf("overlay %v: %s has no %v address", fam, b, fam)
			}
		}
		for _, a := range ctrs {
			for i, b := range ctrs {
				if a == b {
					continue
				}
				start := time.Now()
				if err := a.PingUntil(dsts[i], tr.FirstPing); err != nil {
					return fmt.Errorf("overlay %v: %s -> %s: %w", fam, a, b, err)
				}
				if d := time.Since(start); d > 2*time.Second {
					a.Host.topo.Bed.Logf("first %v ping %s -> %s answered after %v", fam, a, b, d.Round(time.Millisecond))
				}
				for range 3 {
					if err := a.Ping(dsts[i], 2*time.Second); err != nil {
						return fmt.Errorf("overlay %v: %s -> %s after the first answer: %w", fam, a, b, err)
					}
				}
			}
		}
		if tr.TCPSize == 0 {
			continue
		}
		for i, b := range ctrs {
			echo, err := b.StartEcho(netip.AddrPortFrom(dsts[i], tr.EchoPort))
			if err != nil {
				return err
			}
			for _, a := range ctrs {
				if a != b {
					if err := a.TCPExchange(echo.Addr, tr.TCPSize, tr.TCPTimeout); err != nil {
						echo.Close()
						return fmt.Errorf("overlay %v: %w", fam, err)
					}
				}
			}
			if err := echo.Close(); err != nil {
				return fmt.Errorf("echo server in %s: %w", b, err)
			}
		}
	}
	return nil
}

func (c *Container) String() string { return c.Name + "@" + c.Host.Name }
