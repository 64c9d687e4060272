package natsdeploy

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// The compose file's server configuration loads, with JetStream, the payload size sys1 needs
// (SYS1_MAX_MSG_SIZE defaults to 8 MiB) and the durability sys1 ships (sync_interval always).
func TestComposeConfigLoads(t *testing.T) {
	opts, err := server.ProcessConfigFile("compose.conf")
	if err != nil {
		t.Fatalf("compose.conf: %v", err)
	}
	if !opts.JetStream || opts.StoreDir != "/data" {
		t.Errorf("JetStream %v, store %q", opts.JetStream, opts.StoreDir)
	}
	if opts.MaxPayload != 8<<20 {
		t.Errorf("max_payload %d, want %d", opts.MaxPayload, 8<<20)
	}
	if opts.Port != 4222 || opts.HTTPPort != 8222 {
		t.Errorf("ports %d/%d", opts.Port, opts.HTTPPort)
	}
	if !opts.SyncAlways {
		t.Errorf("compose.conf leaves JetStream's sync_interval at %s; sys1 ships always (every write on disk before its ack)", opts.SyncInterval)
	}
}
