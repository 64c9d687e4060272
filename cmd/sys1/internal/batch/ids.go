package batch

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/sys1hq/sys1/contract/wire"
)

// Identifier rules.
//
// A batch id is one NATS subject token (it ends sys1.batch.<caller>.<batch id>) and the group
// of its run ids ("<batch id>:<item id>", SPEC §3: 1–128 of A-Za-z0-9._:-), so it may use only
// A-Za-z0-9_- (no '.', which would split the subject, and no ':', which separates the group
// from the item) and at most MaxBatchIDLen characters, which leaves MaxItemIDLen for the item.
const (
	MaxBatchIDLen = wire.MaxBatchIDLen
	MaxItemIDLen  = wire.MaxRunIDLen - MaxBatchIDLen - 1
	// hashedPrefix starts the item id of a custom id that cannot be used verbatim.
	hashedPrefix = "h-"
	// derivedPrefix starts a batch id derived from the input (DeriveBatchID).
	derivedPrefix = "b-"
)

// ValidBatchID reports why id cannot be a batch id (wire.ValidBatchID), or nil.
func ValidBatchID(id string) error {
	if wire.ValidBatchID(id) {
		return nil
	}
	if id == "" || len(id) > MaxBatchIDLen {
		return fmt.Errorf("batch id %q must be 1–%d characters, got %d", truncate(id, 80), MaxBatchIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if !batchIDChar(id[i]) {
			return fmt.Errorf("batch id %q may use only A-Za-z0-9, '_' and '-' (it is a subject token and the prefix of run ids <batch id>:<item id>); %q at byte %d is not allowed", truncate(id, 80), id[i], i)
		}
	}
	return nil
}

func batchIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func runIDChar(c byte) bool { return batchIDChar(c) || c == '.' || c == ':' }

// ValidCaller reports why caller cannot be the caller token of sys1.batch.<caller>.<batch id>.
// It is exactly one subject token (unlike sys1.decide.<caller>, which may have more, the batch
// subject's next token is the batch id), and it names the inbox prefix _INBOX.<caller>.
func ValidCaller(caller string) error {
	if caller == "" {
		return fmt.Errorf("caller is required (the subject token of sys1.batch.<caller>.<batch id>)")
	}
	if strings.ContainsAny(caller, ".*> \t\r\n") {
		return fmt.Errorf("caller %q must be one subject token: no '.', '*', '>' or white space", truncate(caller, 80))
	}
	return nil
}

// ItemID is the item part of an item's run id, from its custom id: the custom id itself when it
// is 1–MaxItemIDLen of A-Za-z0-9._:-, otherwise "h-" and the first 32 hex digits of the
// SHA-256 of the custom id (deterministic, so a rerun finds the same runs). Two custom ids that
// map to the same item id (a verbatim "h-…" that equals another's hash) are reported as
// duplicates before anything is sent.
func ItemID(customID string) string {
	if len(customID) > 0 && len(customID) <= MaxItemIDLen {
		ok := true
		for i := 0; i < len(customID); i++ {
			if !runIDChar(customID[i]) {
				ok = false
				break
			}
		}
		if ok {
			return customID
		}
	}
	sum := sha256.Sum256([]byte(customID))
	return hashedPrefix + hex.EncodeToString(sum[:16])
}

// RunID is the run id of one item of a batch.
func RunID(batchID, itemID string) string { return batchID + ":" + itemID }

// DeriveBatchID names a batch after what makes its requests: the input's bytes (inputHash, the
// SHA-256 of the file as stored, compressed or not), the caller, and every option that changes
// the requests built from it (fingerprint). The same command on the same file therefore names
// the same batch, and its run ids find the runs an earlier, interrupted invocation finished.
func DeriveBatchID(inputHash [32]byte, caller string, fingerprint []string) string {
	h := sha256.New()
	h.Write([]byte("sys1 batch v1\x00"))
	h.Write(inputHash[:])
	writeField(h, caller)
	for _, f := range fingerprint {
		writeField(h, f)
	}
	sum := h.Sum(nil)
	return derivedPrefix + hex.EncodeToString(sum[:12])
}

// writeField writes s length-prefixed, so ("ab","c") and ("a","bc") hash differently.
func writeField(h interface{ Write([]byte) (int, error) }, s string) {
	_, _ = fmt.Fprintf(h, "%d:", len(s))
	_, _ = h.Write([]byte(s))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
