// Package contract is the System One contract of sys1: what a valid request is, what a valid
// answer is, how errors are named, and the JSON Schemas the world sees.
//
// The flow every request takes:
//
//	req, err := contract.DecodeRequest(body)      // strict: untrusted bytes → validated Request
//	res, err := policy.Resolve(req)               // model default + allow-list, keep_alive, size
//	body, _ := res.MarshalJSON()                  // wire order, state/instructions byte for byte
//	resp, err := contract.DecodeResponse(res, b)  // the provider's answer, checked against res
//	stored := contract.Redact(res)                // for run records: images become hashes
//	rec = *rec.RedactContent(contract.RecordHash) // SYS1_RECORD_STATE, where the record is made
//
// Beside the answers, which stay verbatim, replies and records carry the policy's Verdicts
// (an object keyed by question name, in request order) and a ReviewRef; review items carry
// one question to a reviewer; labels come back strictly decoded (DecodeLabel) and checked
// against the answer they label (CheckLabel), which gives the canonical text ClickHouse keeps.
//
// Order is part of the contract: questions, choice options and every object inside state and
// instructions keep their key order end to end (upstream derives option letters and
// tie-breaks from it), so no Go map is ever used for them. Decoding reads JSON with a small
// purpose-built reader (duplicate keys at any depth, exact raw spans, depth checked before
// anything is built) and encoding appends bytes directly.
//
// Every failure is an *Error with a SPEC §5 code; validation failures carry Problems, each
// with a path such as "questions.label.criteria".
package contract
