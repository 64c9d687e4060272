package loopback

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreDistinctFreeAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Ports(8)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 8 {
		t.Fatalf("%d ports, want 8", len(ports))
	}
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("port %d twice", p)
		}
		seen[p] = true
		if low-lowest >= minChoice && (p < lowest || p >= low) {
			t.Errorf("port %d is outside [%d, %d): the kernel may hand it to any outgoing connection", p, lowest, low)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d was released but cannot be bound: %v", p, err)
			continue
		}
		ln.Close()
	}
}

// A port somebody holds is skipped; the scan goes on to the next.
func TestReserveSkipsAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().(*net.TCPAddr).Port
	// A range of the held port and the two after it, scanned from the held one.
	ports, err := reserve(2, held, held+3, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p == held {
			t.Fatalf("port %d is held by this test and was handed out (got %v)", p, ports)
		}
	}
	if len(ports) != 2 {
		t.Fatalf("%d ports, want 2", len(ports))
	}
}
