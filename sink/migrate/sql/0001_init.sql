-- 0001: the run-record table, its dead-letter table and the per-minute dashboard aggregates.
--
-- Every statement is idempotent (IF NOT EXISTS) so two migrators racing, or a migration that
-- failed half-way and is run again, converge on the same schema. {{.DB}} is the database
-- (SYS1_CLICKHOUSE_DATABASE) and {{.RetentionDays}} the TTL (SYS1_RETENTION_DAYS); Migrate keeps
-- the TTL in step with the configuration on every run, not only when this file first runs.
-- On a cluster (SYS1_CLICKHOUSE_CLUSTER) .OnCluster runs a statement on every node, "local"
-- names the replicated table that stores rows (<table>_local), "engine" makes the engine
-- Replicated*, and "distributed" creates <table> as the Distributed table over it; on one
-- server the first three change nothing and the last is empty (see package migrate).

-- One row per run id under FINAL (SPEC §6). ReplacingMergeTree(finished_at) keeps the newest
-- version of a run written twice (a redelivered record after a sink crash); rows of one run
-- always share a partition because the partition is derived from the same finished_at.
CREATE TABLE IF NOT EXISTS {{local "runs"}}{{.OnCluster}}
(
    -- identity
    run_id          String,
    caller          LowCardinality(String),
    caller_kind     LowCardinality(String),
    roles           Array(LowCardinality(String)),
    scopes          Array(LowCardinality(String)),
    subject         String,

    -- delivery (stream_seq is the SYS1_REQUESTS sequence of the request)
    stream_seq      UInt64,
    deliveries      UInt32,
    published_at    DateTime64(3, 'UTC'),
    started_at      DateTime64(3, 'UTC'),
    finished_at     DateTime64(3, 'UTC'),
    queued_ms       Int64,
    latency_ms      Int64,

    -- outcome
    status          LowCardinality(String),
    error_code      LowCardinality(String),
    error_status    UInt16,
    error_message   String,

    -- what ran
    provider        LowCardinality(String),
    model           LowCardinality(String),
    requested_model LowCardinality(String),
    images          Nested(sha256 String, bytes UInt64),
    attempts        Nested(
                        provider   LowCardinality(String),
                        outcome    LowCardinality(String),
                        latency_ms Int64,
                        detail     String,
                        delivery   UInt32,
                        error_code LowCardinality(String),
                        started_at DateTime64(3, 'UTC')),
    -- the answers flattened in request order: answers.name[i] answered answers.type[i] with
    -- answers.choice[i] (choice), answers.noul[i] = P(true) (noul) or answers.score[i] (score).
    answers         Nested(
                        name          LowCardinality(String),
                        type          LowCardinality(String),
                        choice        LowCardinality(String),
                        noul          Nullable(Float64),
                        score         Nullable(Float64),
                        confidence    Nullable(Float64),
                        probabilities Map(String, Float64)),
    input_tokens    UInt64,
    output_tokens   UInt64,
    reply_to        String,
    -- the resolved request (images redacted; state/instructions per record_state) and the
    -- result, as JSON text; '' when the record has none.
    request         String CODEC(ZSTD(3)),
    result          String CODEC(ZSTD(3)),
    record_state    LowCardinality(String),

    -- provenance
    worker          LowCardinality(String),
    version         LowCardinality(String),
    schema_version  UInt16,

    -- ingestion: where the record came from in SYS1_RUNS and when the sink wrote it
    runs_stream     LowCardinality(String),
    runs_seq        UInt64,
    inserted_at     DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = {{engine "ReplacingMergeTree(finished_at)"}}
PARTITION BY toYYYYMM(finished_at)
ORDER BY run_id
TTL toDateTime(finished_at) + INTERVAL {{.RetentionDays}} DAY
-- The dedup window makes an insert retried with the same insert_deduplication_token a no-op
-- on a non-replicated table (the sink derives the token from the batch's stream sequences);
-- replicated tables deduplicate through Keeper.
{{settings "ttl_only_drop_parts = 1"}};

-- A cluster's runs shard by run id, so every copy of a run meets its others under FINAL.
{{distributed "runs" "cityHash64(run_id)"}};

-- Records the sink can never insert (undecodable, invalid). Kept for an operator; one row per
-- SYS1_RUNS message under FINAL.
CREATE TABLE IF NOT EXISTS {{local "runs_dead_letter"}}{{.OnCluster}}
(
    received_at    DateTime64(3, 'UTC'),
    runs_stream    LowCardinality(String),
    subject        String,
    runs_seq       UInt64,
    deliveries     UInt64,
    error          String,
    -- the message body; in record_state hash/none, state and instructions are redacted from it
    -- when it parses as JSON and it is left empty when it does not (fetch it from the stream
    -- by runs_seq while the stream retains it).
    payload        String CODEC(ZSTD(3)),
    payload_sha256 String,
    payload_bytes  UInt64
)
ENGINE = {{engine "ReplacingMergeTree(received_at)"}}
PARTITION BY toYYYYMM(received_at)
ORDER BY (runs_stream, runs_seq)
TTL toDateTime(received_at) + INTERVAL {{.RetentionDays}} DAY
{{settings}};

{{distributed "runs_dead_letter" "cityHash64(runs_stream, runs_seq)"}};

-- Per-minute aggregates for dashboards. Counts here are per inserted row: a record the sink had
-- to write twice (rare: a crash between insert and ack with a different batch) counts twice,
-- so exact figures come from runs FINAL; runs_distinct is robust to that.
CREATE TABLE IF NOT EXISTS {{local "runs_per_minute"}}{{.OnCluster}}
(
    minute        DateTime('UTC'),
    model         LowCardinality(String),
    caller        LowCardinality(String),
    status        LowCardinality(String),
    runs          SimpleAggregateFunction(sum, UInt64),
    errors        SimpleAggregateFunction(sum, UInt64),
    retried       SimpleAggregateFunction(sum, UInt64),
    attempts      SimpleAggregateFunction(sum, UInt64),
    input_tokens  SimpleAggregateFunction(sum, UInt64),
    output_tokens SimpleAggregateFunction(sum, UInt64),
    latency_ms_sum SimpleAggregateFunction(sum, Int64),
    latency_ms_q  AggregateFunction(quantiles(0.5, 0.9, 0.95, 0.99), Int64),
    queued_ms_q   AggregateFunction(quantiles(0.5, 0.9, 0.95, 0.99), Int64),
    runs_distinct AggregateFunction(uniq, String)
)
ENGINE = {{engine "AggregatingMergeTree"}}
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, model, caller, status)
TTL minute + INTERVAL {{.RetentionDays}} DAY
-- A retried insert into runs is deduplicated here too (the sink sets
-- deduplicate_blocks_in_dependent_materialized_views), so a retry is not counted twice.
{{settings}};

-- Filled only by the view below (on a cluster each shard aggregates its own runs): read-only.
{{distributed "runs_per_minute" ""}};

CREATE MATERIALIZED VIEW IF NOT EXISTS {{.DB}}.runs_per_minute_mv{{.OnCluster}} TO {{local "runs_per_minute"}} AS
SELECT
    toStartOfMinute(finished_at)               AS minute,
    model,
    caller,
    status,
    toUInt64(count())                          AS runs,
    toUInt64(countIf(status = 'failed'))       AS errors,
    toUInt64(countIf(length(attempts.outcome) > 1)) AS retried,
    toUInt64(sum(length(attempts.outcome)))    AS attempts,
    toUInt64(sum(input_tokens))                AS input_tokens,
    toUInt64(sum(output_tokens))               AS output_tokens,
    toInt64(sum(latency_ms))                   AS latency_ms_sum,
    quantilesState(0.5, 0.9, 0.95, 0.99)(latency_ms) AS latency_ms_q,
    quantilesState(0.5, 0.9, 0.95, 0.99)(queued_ms)  AS queued_ms_q,
    uniqState(run_id)                          AS runs_distinct
FROM {{local "runs"}}
GROUP BY minute, model, caller, status;
