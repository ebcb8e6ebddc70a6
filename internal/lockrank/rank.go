package lockrank

import "fmt"

// Rank is a lock's place in the order: a lower rank is taken first.
type Rank int

// A Class names a rank as a type, so that a mutex's rank is part of its
// declared type and needs no initialisation.
type Class interface{ Rank() Rank }

// The classes, in the order of the graph in the package documentation.
type (
	Network      struct{}
	Encryption   struct{}
	Publisher    struct{}
	Cluster      struct{}
	RateLog      struct{}
	Driver       struct{}
	LBSandboxes  struct{}
	Refusals     struct{}
	GroupCommit  struct{}
	SandboxCache struct{}
	Pipeline     struct{}
	Echoes       struct{}
	EventQueue   struct{}
	XFRM         struct{}
	Firewall     struct{}
	ServiceWatch struct{}
	Gate         struct{}
	Health       struct{}
	KeyRelay     struct{}
	SourceFilter struct{}
	LBTables     struct{}
	LBPaths      struct{}
	Channel      struct{}
	Channels     struct{}
	StreamPool   struct{}
	SessionMu    struct{}
)

func (Network) Rank() Rank      { return 1 }
func (Encryption) Rank() Rank   { return 2 }
func (Publisher) Rank() Rank    { return 3 }
func (Cluster) Rank() Rank      { return 4 }
func (RateLog) Rank() Rank      { return 5 }
func (Driver) Rank() Rank       { return 6 }
func (LBSandboxes) Rank() Rank  { return 7 }
func (Refusals) Rank() Rank     { return 8 }
func (GroupCommit) Rank() Rank  { return 9 }
func (SandboxCache) Rank() Rank { return 10 }
func (Pipeline) Rank() Rank     { return 11 }
func (Echoes) Rank() Rank       { return 12 }
func (EventQueue) Rank() Rank   { return 13 }
func (XFRM) Rank() Rank         { return 14 }
func (Firewall) Rank() Rank     { return 15 }
func (ServiceWatch) Rank() Rank { return 16 }
func (Gate) Rank() Rank         { return 17 }
func (Health) Rank() Rank       { return 18 }
func (KeyRelay) Rank() Rank     { return 19 }
func (SourceFilter) Rank() Rank { return 20 }
func (LBTables) Rank() Rank     { return 21 }
func (LBPaths) Rank() Rank      { return 22 }
func (Channel) Rank() Rank      { return 23 }
func (Channels) Rank() Rank     { return 24 }
func (StreamPool) Rank() Rank   { return 25 }
func (SessionMu) Rank() Rank    { return 26 }

// Classes lists every class in rank order (the documentation's table is
// checked against it).
var Classes = []Class{Network{}, Encryption{}, Publisher{}, Cluster{}, RateLog{}, Driver{}, LBSandboxes{},
	Refusals{}, GroupCommit{}, SandboxCache{}, Pipeline{}, Echoes{}, EventQueue{}, XFRM{}, Firewall{},
	ServiceWatch{}, Gate{}, Health{}, KeyRelay{}, SourceFilter{}, LBTables{}, LBPaths{}, Channel{}, Channels{},
	StreamPool{}, SessionMu{}}

// Name is a class's name, as the documentation's table writes it.
func Name(c Class) string {
	return fmt.Sprintf("%T", c)[len("lockrank."):]
}
