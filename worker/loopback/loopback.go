// Package loopback reserves TCP ports on 127.0.0.1 for servers a process starts itself and
// must name before they start: the nodes of a nats-server cluster (each lists the others'
// route ports), a worker's HTTP listener given by SYS1_HTTP_ADDR.
//
// A port is free only until somebody takes it. Ports from the kernel's ephemeral range are
// the worst choice: the moment one is released, any process's outgoing connection can take it
// as its source port and hold it for as long as the connection lives (seen in CI: a soak
// node's route port held by a parallel test's connection for 5 s, the node failing to start
// five times). So Ports chooses below that range, where only a program binding a port by its
// number can take it, and falls back to the kernel's choice only where it cannot.
package loopback

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port Ports chooses: well above the registered services a machine
// commonly runs below 10000.
const lowest = 10000

// minChoice is the fewest ports below the ephemeral range worth choosing from; a machine
// whose range starts lower than lowest+minChoice gets the kernel's choice.
const minChoice = 1000

// Ports returns n distinct ports that were free on 127.0.0.1 a moment ago (they are
// released on return, for the caller's servers to bind).
func Ports(n int) ([]int, error) {
	top := ephemeralLow()
	if top-lowest < minChoice {
		return reserve(n, 0, 0, 0)
	}
	// From a random start, so processes choosing at once rarely try the same ports.
	return reserve(n, lowest, top, rand.IntN(top-lowest))
}

// reserve binds n ports, trying [from, to) in turn from from+start (wrapping), then the
// kernel's choice for any still missing; it releases them all on return, after choosing
// every one, so they are distinct.
func reserve(n, from, to, start int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	take := func(addr string) bool {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		held = append(held, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		return true
	}
	for i, span := 0, to-from; i < span && len(ports) < n; i++ {
		take(fmt.Sprintf("127.0.0.1:%d", from+(start+i)%span))
	}
	for len(ports) < n {
		if !take("127.0.0.1:0") {
			return nil, fmt.Errorf("reserve %d loopback ports: no free port after %d", n, len(ports))
		}
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, 0 where it is unknown
// (not Linux).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return lo
}
