package topology

import (
	"fmt"
	"strings"

	"github.com/sys1hq/sys1/contract/wire"
)

// CallerToken returns the caller token of the subjects producers publish on:
// sys1.decide.<caller>[.<more>], sys1.batch.<caller>.<batch id> and sys1.labels.<caller>.
// The NATS server's per-user publish permissions tie that token to the producer's NATS user
// (deploy/nats), which is what makes it the caller in auth mode subject, the namespace of a
// caller's replies in every mode, and the namespace of its review items.
func CallerToken(subject string) (string, error) {
	var rest string
	var ok bool
	for _, prefix := range []string{wire.DecidePrefix, wire.BatchPrefix, wire.LabelsPrefix} {
		if rest, ok = strings.CutPrefix(subject, prefix); ok {
			break
		}
	}
	if !ok {
		return "", fmt.Errorf("subject %q is not under %s<caller>, %s<caller> or %s<caller>", subject, wire.DecidePrefix, wire.BatchPrefix, wire.LabelsPrefix)
	}
	caller, _, _ := strings.Cut(rest, ".")
	if caller == "" || caller == "*" || caller == ">" || strings.ContainsAny(caller, " \t\r\n") {
		return "", fmt.Errorf("subject %q has no caller token", subject)
	}
	return caller, nil
}

// ReviewSubject is the one rule for where review items live. The items of a run whose request
// was published on requestSubject go to sys1.review.<token>, token being that subject's
// caller token (CallerToken), in every auth mode: the worker publishes them there, and the
// review page accepts an item only on the subject this function gives for the request subject
// the item names (contract.ReviewItem.Subject). The token, not the verified caller, because a
// JWT's sub need not be a subject token at all; the verified caller stays in the item's caller
// field, which is what the page shows, filters on and labels as.
//
// A reviewer's label for an item on sys1.review.<token> goes to sys1.labels.<token>.accepted
// (ReviewLabelSubject), so review items, labels and replies of one producer share one
// namespace.
func ReviewSubject(requestSubject string) (string, error) {
	token, err := CallerToken(requestSubject)
	if err != nil {
		return "", fmt.Errorf("review subject: %w", err)
	}
	return wire.Review(token), nil
}

// ReviewToken is the token of a review item's subject (sys1.review.<token>).
func ReviewToken(reviewSubject string) (string, error) {
	token, ok := strings.CutPrefix(reviewSubject, wire.ReviewPrefix)
	if !ok || token == "" || strings.ContainsAny(token, ".*> \t\r\n") {
		return "", fmt.Errorf("subject %q is not %s<token>", reviewSubject, wire.ReviewPrefix)
	}
	return token, nil
}

// ReviewLabelSubject is where the review page publishes the label of an item it read on
// reviewSubject: sys1.labels.<token>.accepted, the item's own token (see ReviewSubject).
func ReviewLabelSubject(reviewSubject string) (string, error) {
	token, err := ReviewToken(reviewSubject)
	if err != nil {
		return "", err
	}
	return wire.LabelAccepted(token), nil
}
