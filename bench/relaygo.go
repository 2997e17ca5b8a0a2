package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
)

// relayGoroutines is the relay (relayMain's arguments, the same record
// layer and 256 KiB reads) written on the I/O model ztunnel's data path
// uses instead of an epoll loop of its own: a goroutine per direction,
// Go's poller for readiness, raw read and write calls through
// syscall.RawConn, as many Ps as cores. With BENCH_RELAY_MODE=goroutines in
// the harness's environment both relay yardsticks run this way, which
// splits their gap to ztunnel into what Go's I/O model costs and what
// ztunnel itself does. Its goroutines end with the process.
func relayGoroutines(args []string, stdin *os.File, stdout io.Writer) error {
	runtime.GOMAXPROCS(runtime.NumCPU())
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for _, a := range args {
		ra, err := parseRelayArg(a)
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp4", ra.listen.String())
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		lns = append(lns, ln)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go serveGoroutines(c, ra)
			}
		}()
	}
	if _, err := fmt.Fprintln(stdout, relayReady); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, stdin)
	return nil
}

// serveGoroutines relays one accepted connection to a new one to
// ra.target, sealing either side as ra says.
func serveGoroutines(down net.Conn, ra relayArg) {
	up, err := mssDialer(ra.targetMSS).Dial("tcp4", ra.target.String())
	if err != nil {
		down.Close()
		return
	}
	var ds, us *sealer
	if ra.sealListen {
		ds, _ = newSealer(false)
	}
	if ra.sealTarget {
		us, _ = newSealer(true)
	}
	done := make(chan struct{}, 2)
	go func() { pumpGoroutine(down, ds, up, us); done <- struct{}{} }()
	go func() { pumpGoroutine(up, us, down, ds); done <- struct{}{} }()
	<-done
	<-done
	down.Close()
	up.Close()
}

// pumpGoroutine copies src to dst until src's end (then half-closes dst)
// or an error (then closes both), opening src's records if rs is set and
// sealing what goes to dst if ws is.
func pumpGoroutine(src net.Conn, rs *sealer, dst net.Conn, ws *sealer) {
	rrc, _ := src.(syscall.Conn).SyscallConn()
	wrc, _ := dst.(syscall.Conn).SyscallConn()
	buf := make([]byte, relayBufSize)
	sbuf := make([]byte, 0, sealedSize(relayBufSize))
	var in []byte
	fail := func() { src.Close(); dst.Close() }
	for {
		k := copy(buf, in)
		var n int
		var errno syscall.Errno
		err := rrc.Read(func(fd uintptr) bool {
			n, errno = rawRead(int(fd), buf[k:])
			return errno != syscall.EAGAIN
		})
		if err != nil || errno != 0 {
			fail()
			return
		}
		if n == 0 {
			_ = dst.(*net.TCPConn).CloseWrite()
			return
		}
		data := buf[:k+n]
		if rs != nil {
			plain, rest, err := rs.open(data)
			if err != nil {
				fail()
				return
			}
			in = append(in[:0], rest...)
			data = plain
		}
		if len(data) == 0 {
			continue // a record's start; its end comes with the next read
		}
		if ws != nil {
			sbuf = ws.seal(sbuf[:0], data)
			data = sbuf
		}
		off := 0
		err = wrc.Write(func(fd uintptr) bool {
			for off < len(data) {
				m, e := rawWrite(int(fd), data[off:])
				if e == syscall.EAGAIN {
					return false
				}
				if e != 0 {
					errno = e
					return true
				}
				off += m
			}
			return true
		})
		if err != nil || errno != 0 {
			fail()
			return
		}
	}
}
