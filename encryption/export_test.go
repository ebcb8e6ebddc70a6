package encryption

// The internal tests' fixtures, for the external ones: the manager's tests
// are in package encryption_test because they run on fakexfrm, which
// imports this package.
var (
	TestSecret   = secret
	TestSalts    = []Salt{{ID: "0000000a", Key: secret}}
	TestHostA    = hostA
	TestT0       = t0
	TestSchedule = testSchedule()
)
