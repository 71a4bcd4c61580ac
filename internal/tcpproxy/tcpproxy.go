// Package tcpproxy is a TCP proxy on 127.0.0.1 for pglock's lifecycle and fault tests:
// it stands between a client and PostgreSQL and can make the link slow (every chunk
// held for a delay) or silent (black-holed: no byte moves either way and new
// connections wait, as behind a partition), then let everything held go on, late.
package tcpproxy

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Proxy forwards every connection made to Addr to a new connection from its dial
// function. Its methods are safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream func(ctx context.Context) (net.Conn, error)
	ctx      context.Context // ends at Close
	cancel   context.CancelFunc

	mu      sync.Mutex
	gate    chan struct{} // closed while traffic flows
	trip    *trip         // BlackholeAfter's, until its chunk comes
	delay   [2]time.Duration
	conns   map[net.Conn]bool // true: a client's side
	sent    []*trip           // Sent's, until their chunks come
	wg      sync.WaitGroup
	accepts int
}

// Direction is which way a delay applies.
type Direction int

const (
	// ToServer is the client's requests.
	ToServer Direction = iota
	// ToClient is the server's replies.
	ToClient
)

// New listens on 127.0.0.1 and forwards each connection to a new connection from dial.
func New(dial func(ctx context.Context) (net.Conn, error)) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{ln: ln, upstream: dial, ctx: ctx, cancel: cancel, gate: make(chan struct{}), conns: make(map[net.Conn]bool)}
	close(p.gate)
	p.wg.Go(p.accept)
	return p, nil
}

// To returns a dial function for New that reaches the PostgreSQL server at host and
// port: its TCP address, or its Unix socket when host is a directory.
func To(host string, port uint16) func(ctx context.Context) (net.Conn, error) {
	network, addr := "tcp", net.JoinHostPort(host, strconv.Itoa(int(port)))
	if strings.HasPrefix(host, "/") {
		network, addr = "unix", filepath.Join(host, ".s.PGSQL."+strconv.Itoa(int(port)))
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// Addr is the host:port clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted returns how many connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Blackhole stops all traffic until Restore.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already
	}
}

// Restore lets traffic flow again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// trip is a BlackholeAfter that has not met its chunk yet.
type trip struct {
	match   func(chunk []byte) bool
	tripped chan struct{}
}

// BlackholeAfter makes the link silent at the worst moment for a statement in flight:
// the next chunk sent to the server for which match reports true is passed on, and
// from then on no byte moves until Restore, as Blackhole does. The channel it returns is
// closed when that chunk has been passed on. match sees each chunk as the client wrote
// it, in one piece up to 32 KiB.
func (p *Proxy) BlackholeAfter(match func(chunk []byte) bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trip = &trip{match: match, tripped: make(chan struct{})}
	return p.trip.tripped
}

// Sent returns a channel closed once a chunk to the server for which match reports
// true has been read from a client: it may still be held by a delay or a black hole.
func (p *Proxy) Sent(match func(chunk []byte) bool) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := &trip{match: match, tripped: make(chan struct{})}
	p.sent = append(p.sent, t)
	return t.tripped
}

// Drop closes the clients' side of every connection open now, as a link that breaks on
// the client's side: what was read from a client still reaches the server (after any
// delay), and what the server answers is lost. New connections go through as before.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, client := range p.conns {
		if client {
			_ = c.Close()
		}
	}
}

// read notes a chunk read from a client for Sent.
func (p *Proxy) read(chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = slices.DeleteFunc(p.sent, func(t *trip) bool {
		if t.match(chunk) {
			close(t.tripped)
			return true
		}
		return false
	})
}

// tripOn black-holes the link when chunk, passed on to the server next, is the one that
// BlackholeAfter waits for; the caller closes the returned channel once the chunk is
// written (nil: not that chunk).
func (p *Proxy) tripOn(chunk []byte) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trip == nil || !p.trip.match(chunk) {
		return nil
	}
	tripped := p.trip.tripped
	p.trip = nil
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
	return tripped
}

// SetDelay holds every chunk that goes in direction dir for d before it is passed on
// (0: none). Chunks stay in order.
func (p *Proxy) SetDelay(dir Direction, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[dir] = d
}

// pass waits until traffic may flow in dir, and reports false once the proxy is closed.
func (p *Proxy) pass(dir Direction) bool {
	p.mu.Lock()
	gate, delay := p.gate, p.delay[dir]
	p.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
			return false
		}
	}
	select {
	case <-gate:
		return p.ctx.Err() == nil
	case <-p.ctx.Done():
		return false
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c, true) {
			return
		}
		p.mu.Lock()
		p.accepts++
		p.mu.Unlock()
		p.wg.Go(func() { p.serve(c) })
	}
}

// track registers c, a client's side or the server's, so that Close (and Drop, a
// client's) can end it; false once the proxy is closed.
func (p *Proxy) track(c net.Conn, client bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		_ = c.Close()
		return false
	}
	p.conns[c] = client
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) serve(client net.Conn) {
	defer p.untrack(client)
	if !p.pass(ToServer) {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	server, err := p.upstream(ctx)
	cancel()
	if err != nil || !p.track(server, false) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client, ToServer); done <- struct{}{} }()
	go func() { p.pipe(client, server, ToClient); done <- struct{}{} }()
	<-done // one side ended: end both
	_ = client.Close()
	_ = server.Close()
	<-done
}

// pipe copies src to dst, holding each chunk for the delay and while black-holed.
func (p *Proxy) pipe(dst, src net.Conn, dir Direction) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if dir == ToServer {
				p.read(buf[:n])
			}
			if !p.pass(dir) {
				return
			}
			var tripped chan struct{}
			if dir == ToServer {
				tripped = p.tripOn(buf[:n]) // silent before the server can answer it
			}
			_, werr := dst.Write(buf[:n])
			if tripped != nil {
				close(tripped)
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, or closed by the other direction or by Close
		}
	}
}

// Close ends every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.cancel()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
