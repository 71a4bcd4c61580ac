package tcpproxy

import (
	"context"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoProxy returns a connection through a proxy to an echo server.
func echoProxy(t *testing.T) (*Proxy, net.Conn) {
	t.Helper()
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	p, err := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", echo.Addr().String())
	})
	require.NoError(t, err)
	conn, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		p.Close()
		_ = echo.Close()
		<-done
	})
	return p, conn
}

func roundTrip(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	_, err := conn.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
}

// The proxy holds traffic while black-holed and delivers it, late, once restored.
func TestBlackholeHoldsThenDelivers(t *testing.T) {
	t.Parallel()
	p, conn := echoProxy(t)
	roundTrip(t, conn, "hello")

	p.Blackhole()
	_, err := conn.Write([]byte("stale"))
	require.NoError(t, err)
	buf := make([]byte, 5)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	_, err = conn.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing passes a black hole")

	p.Restore()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.ReadFull(conn, buf)
	require.NoError(t, err)
	require.Equal(t, "stale", string(buf), "what was held is delivered after the restore")
	require.Equal(t, 1, p.Accepted())
}

// A delay holds each chunk in its direction; a round trip takes at least the delay.
func TestDelayHoldsEveryChunk(t *testing.T) {
	t.Parallel()
	p, conn := echoProxy(t)
	p.SetDelay(ToClient, 150*time.Millisecond)
	start := time.Now()
	roundTrip(t, conn, "slow")
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
	p.SetDelay(ToClient, 0)
	start = time.Now()
	roundTrip(t, conn, "fast")
	require.Less(t, time.Since(start), 150*time.Millisecond)
}
