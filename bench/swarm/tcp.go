package swarm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// StreamBytes is what one TCP stream carried.
type StreamBytes struct {
	Sent     int64 `json:"sent"`
	Received int64 `json:"received"`
}

// tcpResult is one throughput run.
type tcpResult struct {
	Gbps    float64
	Seconds float64
	Streams []StreamBytes
	// Correct: every stream ended cleanly and delivered exactly what was
	// sent.
	Correct bool
	Error   string
}

// tcpRun sends from the namespace at sendNS to a listener on dst in the
// namespace at recvNS over `streams` TCP connections for d: each sender
// writes 128 KiB buffers until d has passed and then closes its side; the
// receivers read to the end. Gbit/s is every byte received over the time
// from the first write to the last stream's end at the receiver.
func tcpRun(sendNS, recvNS string, dst netip.AddrPort, streams int, d time.Duration) tcpResult {
	res := tcpResult{Streams: make([]StreamBytes, streams)}
	fail := func(err error) tcpResult { res.Error, res.Correct = err.Error(), false; return res }
	ln, err := listenIn(recvNS, dst.String())
	if err != nil {
		return fail(err)
	}
	defer ln.Close()

	type recv struct {
		port int // the sender's: its stream
		n    int64
		end  time.Time
		err  error
	}
	recvd := make(chan recv, streams)
	var accepted sync.WaitGroup
	accepted.Add(1)
	var acceptErr error
	go func() {
		defer accepted.Done()
		for range streams {
			c, err := ln.Accept()
			if err != nil {
				acceptErr = err
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 256<<10)
				var n int64
				var err error
				for {
					var k int
					k, err = c.Read(buf)
					n += int64(k)
					if err != nil {
						break
					}
				}
				if errors.Is(err, io.EOF) {
					err = nil
				}
				recvd <- recv{c.RemoteAddr().(*net.TCPAddr).Port, n, time.Now(), err}
			}()
		}
	}()

	conns := make([]net.Conn, 0, streams)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err := inNetNS(sendNS, func() error {
		for range streams {
			c, err := net.DialTimeout("tcp4", dst.String(), 10*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	accepted.Wait()
	if acceptErr != nil {
		return fail(fmt.Errorf("accept: %w", acceptErr))
	}

	buf := make([]byte, 128<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	sent := make([]int64, streams)
	senderr := make([]error, streams)
	var wg sync.WaitGroup
	t0 := time.Now()
	end := t0.Add(d)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				n, err := c.Write(buf)
				sent[i] += int64(n)
				if err != nil {
					senderr[i] = err
					return
				}
			}
			senderr[i] = c.(*net.TCPConn).CloseWrite()
		}()
	}
	wg.Wait()
	stream := map[int]int{} // the sender's port: its stream
	for i, c := range conns {
		stream[c.LocalAddr().(*net.TCPAddr).Port] = i
	}
	var last time.Time
	var total int64
	res.Correct = true
	timeout := time.After(d + time.Minute)
	for range streams {
		select {
		case r := <-recvd:
			if r.err != nil {
				return fail(fmt.Errorf("receive: %w", r.err))
			}
			i, ok := stream[r.port]
			if !ok {
				return fail(fmt.Errorf("a connection from port %d, which no sender has", r.port))
			}
			res.Streams[i].Received = r.n
			total += r.n
			last = r.end
		case <-timeout:
			return fail(fmt.Errorf("receivers did not finish within %v of the senders", time.Minute))
		}
	}
	for i, err := range senderr {
		if err != nil {
			return fail(fmt.Errorf("send, stream %d: %w", i, err))
		}
		res.Streams[i].Sent = sent[i]
		if sent[i] != res.Streams[i].Received || sent[i] == 0 {
			res.Correct = false
			res.Error = fmt.Sprintf("stream %d: %d bytes sent, %d received", i, sent[i], res.Streams[i].Received)
		}
	}
	res.Seconds = last.Sub(t0).Seconds()
	res.Gbps = float64(total) * 8 / res.Seconds / 1e9
	return res
}
