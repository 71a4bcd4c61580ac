package main

import (
	"context"
	"net"
	"sync"
	"time"
)

// proxy is a TCP proxy on 127.0.0.1 between one worker slot and PostgreSQL, which the
// nemesis can black-hole: while it is, no byte moves either way and new connections
// wait, as behind a partition; restore lets everything held go on, late.
type proxy struct {
	ln       net.Listener
	upstream func(ctx context.Context) (net.Conn, error)
	ctx      context.Context // ends at close
	cancel   context.CancelFunc

	mu    sync.Mutex
	gate  chan struct{} // closed while traffic flows
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newProxy listens on 127.0.0.1 and forwards each connection to a new connection from
// dial.
func newProxy(dial func(ctx context.Context) (net.Conn, error)) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proxy{ln: ln, upstream: dial, ctx: ctx, cancel: cancel, gate: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	close(p.gate)
	p.wg.Go(p.accept)
	return p, nil
}

// addr is the host:port workers dial.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// blackhole stops all traffic until restore.
func (p *proxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already
	}
}

// restore lets traffic flow again.
func (p *proxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// pass waits until traffic may flow, and reports false once the proxy is closed.
func (p *proxy) pass() bool {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	select {
	case <-gate:
		return p.ctx.Err() == nil
	case <-p.ctx.Done():
		return false
	}
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// track registers c so that close can end it; false once the proxy is closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *proxy) serve(client net.Conn) {
	defer p.untrack(client)
	if !p.pass() {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	server, err := p.upstream(ctx)
	cancel()
	if err != nil || !p.track(server) {
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done // one side ended: end both
	_ = client.Close()
	_ = server.Close()
	<-done
}

// pipe copies src to dst, holding each chunk while the proxy is black-holed.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF, or closed by the other direction or by close
		}
	}
}

// close ends every connection and waits for the proxy's goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.cancel()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}
