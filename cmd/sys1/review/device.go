package review

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Who is signing in, as far as throttling goes. A failed sign-in counts against the name it
// named and, apart, against the address it came from; strangers must not be able to turn
// either against a reviewer:
//
//   - The address is the client's, not a proxy's: behind the TLS proxy README recommends,
//     every request comes from the proxy, so its address would make nine strangers' failures
//     lock everyone out. SYS1_REVIEW_TRUSTED_PROXIES names the proxies whose X-Forwarded-For
//     is believed (clientAddr).
//   - A browser a reviewer has signed in with before carries a device cookie: proof, made with
//     the reviewer's own password hash, that this browser knew the password. Its sign-ins count
//     only against that device, never against the name or the address, so neither a stranger
//     guessing the reviewer's password elsewhere nor one spraying names from the same address
//     slows it down (OWASP's "device cookies"). A new password voids it.

// deviceTTL is how long a device cookie is honoured.
const deviceTTL = 30 * 24 * time.Hour

func (s *Server) deviceCookieName() string {
	if s.secure {
		return "__Host-sys1_review_device"
	}
	return "sys1_review_device"
}

// deviceToken is a device cookie for name: its name, when it was issued, and an HMAC of both
// keyed with the name's password hash.
func deviceToken(name string, key []byte, issued time.Time) string {
	payload := base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + strconv.FormatInt(issued.Unix(), 10)
	return payload + "." + deviceMAC(payload, key)
}

func deviceMAC(payload string, key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("sys1 review device\x00" + payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// deviceOf reports the device key of a request signing in as name: set when it carries a
// device cookie issued for name, unexpired, made with name's current password hash.
func (s *Server) deviceOf(r *http.Request, name string) (string, bool) {
	c, err := r.Cookie(s.deviceCookieName())
	if err != nil || len(c.Value) > 512 {
		return "", false
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 3 {
		return "", false
	}
	who, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || string(who) != name {
		return "", false
	}
	issued, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || s.now().Sub(time.Unix(issued, 0)) > deviceTTL || time.Unix(issued, 0).After(s.now().Add(time.Minute)) {
		return "", false
	}
	key := s.users.Current().deviceKey(name)
	if key == nil || !hmac.Equal([]byte(parts[2]), []byte(deviceMAC(parts[0]+"."+parts[1], key))) {
		return "", false
	}
	return "device:" + parts[2][:16], true
}

// setDevice gives the browser that just signed in as name its device cookie.
func (s *Server) setDevice(w http.ResponseWriter, name string) {
	key := s.users.Current().deviceKey(name)
	if key == nil {
		return
	}
	// Path=/: the __Host- prefix (under TLS) requires it.
	http.SetCookie(w, &http.Cookie{Name: s.deviceCookieName(), Value: deviceToken(name, key, s.now()), Path: "/",
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteStrictMode, MaxAge: int(deviceTTL / time.Second)})
}

// clientAddr is the address a request came from: the connection's peer, or, when that peer is
// one of the trusted proxies, the last address in X-Forwarded-For that is not itself a trusted
// proxy (the one the nearest trusted proxy saw). Anything unparsable falls back to the peer.
func clientAddr(r *http.Request, trusted []netip.Prefix) string {
	peer := r.RemoteAddr
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	ip, err := netip.ParseAddr(peer)
	if err != nil || !isTrusted(ip, trusted) {
		return peer
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		a, err := netip.ParseAddr(hop)
		if err != nil {
			return peer // a forged or garbled hop: trust nothing past it
		}
		if !isTrusted(a.Unmap(), trusted) {
			return a.Unmap().String()
		}
	}
	return peer
}

func isTrusted(ip netip.Addr, trusted []netip.Prefix) bool {
	ip = ip.Unmap()
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// ParseTrustedProxies reads SYS1_REVIEW_TRUSTED_PROXIES: a comma list of addresses and CIDR
// prefixes (10.0.0.0/8, 127.0.0.1, ::1).
func ParseTrustedProxies(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, &proxyError{f}
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

type proxyError struct{ v string }

func (e *proxyError) Error() string {
	return strconv.Quote(e.v) + " is not an IP address or CIDR prefix (10.0.0.0/8, 127.0.0.1)"
}
