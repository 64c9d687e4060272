// Package batch is the producer side of sys1 batches ('sys1 batch run|status|cancel'): a
// dataset of System One requests published to sys1.batch.<caller>.<batch id> with a bounded
// window, its replies written in input order, resumable after any interruption.
//
// # Input
//
// A JSONL file, gzip-compressed or not (told by its magic bytes, not its name), each line a
// System One request or {"custom_id": "…", "body": {request}}; or, with a Template, rows of CSV,
// TSV (with a header) or JSONL objects whose fields fill the template's "state". Blank lines
// are not items. A line without a custom id is named by its line number. Input is read twice
// (Scan validates and hashes it, Run sends it), one line at a time: a line longer than
// MaxLineBytes (the contract's largest request plus a wrapper) is refused with its line number
// and skipped without being held in memory.
//
// Every line is checked as a worker would check it (contract.DecodeRequest and the size limits
// of resolution); only the model allow-list is left to the workers, which alone know it. A bad
// line is reported with its line, custom id and the contract's message (which names every
// problem with its path), written to the errors file, and never sent. Duplicate custom ids (or
// two custom ids that map to one run id) stop the batch before anything is sent.
//
// # Identifiers
//
// The batch id is chosen (ValidBatchID: 1–64 of A-Za-z0-9_-, a subject token and a run-id
// group) or derived from the input's bytes, the caller and the options that shape requests
// (DeriveBatchID), so the same command on the same file names the same batch. Run ids are
// "<batch id>:<item id>" (SPEC §3); the item id is the custom id when it is 1–63 of
// A-Za-z0-9._:-, else "h-" and 32 hex digits of its SHA-256 (ItemID).
//
// # Sending
//
// Each item is published with Sys1-Run-Id, Sys1-Reply-To (an inbox under the connection's
// prefix, one reply subject per item, so even a reply under a derived run id finds its item),
// Nats-Msg-Id (the run id, this invocation and the send count: see runner.send for why not the
// bare run id), Sys1-Deadline and Authorization when set. At most RunConfig.InFlight items are
// unanswered, and items answered ahead of an earlier one wait in a reorder buffer of at most
// as many, so memory is bounded whatever the order of replies. Replies are at least once: a
// second reply for an item is dropped. An item whose reply is overdue is published again (see
// runner.resend); the run-id gate makes that safe.
//
// # Resume and output
//
// Output is rebuilt from scratch by every run, into OUT.partial and OUT.errors.jsonl.partial,
// renamed only when every line is in (Output.Commit): a file under its final name is always
// complete. Running again after an interruption (kill -9 included) publishes every item again;
// the run-id gate answers the finished ones from their stored outcomes, without a provider
// call, and the others run. Output lines hold only the input's ids and the reply's stored
// bytes, never a time, so the output is byte-identical to an uninterrupted run's.
//
// # Status and cancel
//
// Status counts a batch from the run-id gate (worker.GateGroupFilter) and the request stream;
// Cancel writes a cancel marker and purges the batch's queued requests (see CancelMarkerKey).
// Both need an operator's NATS permissions.
package batch
