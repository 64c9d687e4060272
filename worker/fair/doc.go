// Package fair shares a worker replica's slots between callers: weighted deficit round
// robin between callers (and between a caller's batches), instead of arrival order.
//
// # Why
//
// Requests of every caller share one JetStream stream. Read through one shared consumer they
// come out in arrival order, so a caller that publishes 1,000 requests makes every other
// caller wait behind all of them. A noisy caller must not raise the others' wait.
//
// # How
//
// The queue stays in JetStream: nothing is taken out of it before a slot is free for it, and
// nothing acknowledged lives only in a worker's memory. What changes is how it is read. Each
// flow — a caller's interactive requests, one batch of a caller, a caller's label
// submissions — has a durable pull consumer of its own, filtered to the flow's subjects and
// shared by every replica (topology.FlowConsumerConfig). A Lane knows which flows have
// messages waiting and, when the pull loop has free slots, fetches from them in the order the
// Scheduler gives. Flows are found three ways:
//
//   - arrivals: the stream republishes the headers of every message it stores on
//     sys1.arrivals.<subject> (wire.ArrivalsPrefix), so an idle replica learns of a
//     caller's first request the moment it is stored;
//   - retries: a delivery the worker hands back with a delay wakes its flow when the delay
//     has passed;
//   - discovery: the stream's subject state, read every second while the stream holds
//     messages, finds whatever the other two missed (a replica that died holding messages,
//     an arrival lost in a NATS failover).
//
// A flow's consumer is created when its flow is first seen and removed by JetStream once it
// has been idle for topology.Config.FlowInactiveThreshold.
//
// Fairness is per replica: each replica shares its own slots fairly, so the fleet does too.
package fair
