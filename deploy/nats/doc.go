// Package natsdeploy holds sys1's production nats-server configuration (nats-server.conf). Its
// test loads that very file into an in-process server and proves the per-user permissions:
// a producer can publish only as itself and cannot read other callers' replies or the run
// records, while the worker and the sink can do their jobs.
package natsdeploy
