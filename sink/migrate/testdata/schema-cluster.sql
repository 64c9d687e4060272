-- sys1 ClickHouse schema version 6, database sys1, cluster analytics, retention 90 days.

-- bootstrap

CREATE DATABASE IF NOT EXISTS `sys1` ON CLUSTER `analytics`;

CREATE TABLE IF NOT EXISTS `sys1`.schema_migrations ON CLUSTER `analytics` (
		version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC')
	) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/all/{database}/{table}', '{replica}', applied_at) ORDER BY version;

-- 0001_init

-- 0001: the run-record table, its dead-letter table and the per-minute dashboard aggregates.
--
-- Every statement is idempotent (IF NOT EXISTS) so two migrators racing, or a migration that
-- failed half-way and is run again, converge on the same schema. `sys1` is the database
-- (SYS1_CLICKHOUSE_DATABASE) and 90 the TTL (SYS1_RETENTION_DAYS); Migrate keeps
-- the TTL in step with the configuration on every run, not only when this file first runs.
-- On a cluster (SYS1_CLICKHOUSE_CLUSTER) .OnCluster runs a statement on every node, "local"
-- names the replicated table that stores rows (<table>_local), "engine" makes the engine
-- Replicated*, and "distributed" creates <table> as the Distributed table over it; on one
-- server the first three change nothing and the last is empty (see package migrate).

-- One row per run id under FINAL (SPEC §6). ReplacingMergeTree(finished_at) keeps the newest
-- version of a run written twice (a redelivered record after a sink crash); rows of one run
-- always share a partition because the partition is derived from the same finished_at.
CREATE TABLE IF NOT EXISTS `sys1`.runs_local ON CLUSTER `analytics`
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', finished_at)
PARTITION BY toYYYYMM(finished_at)
ORDER BY run_id
TTL toDateTime(finished_at) + INTERVAL 90 DAY
-- The dedup window makes an insert retried with the same insert_deduplication_token a no-op
-- on a non-replicated table (the sink derives the token from the batch's stream sequences);
-- replicated tables deduplicate through Keeper.
SETTINGS ttl_only_drop_parts = 1;

-- A cluster's runs shard by run id, so every copy of a run meets its others under FINAL.
CREATE OR REPLACE TABLE `sys1`.runs ON CLUSTER `analytics` AS `sys1`.runs_local
ENGINE = Distributed('analytics', 'sys1', 'runs_local', cityHash64(run_id));

-- Records the sink can never insert (undecodable, invalid). Kept for an operator; one row per
-- SYS1_RUNS message under FINAL.
CREATE TABLE IF NOT EXISTS `sys1`.runs_dead_letter_local ON CLUSTER `analytics`
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', received_at)
PARTITION BY toYYYYMM(received_at)
ORDER BY (runs_stream, runs_seq)
TTL toDateTime(received_at) + INTERVAL 90 DAY;

CREATE OR REPLACE TABLE `sys1`.runs_dead_letter ON CLUSTER `analytics` AS `sys1`.runs_dead_letter_local
ENGINE = Distributed('analytics', 'sys1', 'runs_dead_letter_local', cityHash64(runs_stream, runs_seq));

-- Per-minute aggregates for dashboards. Counts here are per inserted row: a record the sink had
-- to write twice (rare: a crash between insert and ack with a different batch) counts twice,
-- so exact figures come from runs FINAL; runs_distinct is robust to that.
CREATE TABLE IF NOT EXISTS `sys1`.runs_per_minute_local ON CLUSTER `analytics`
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
ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toYYYYMM(minute)
ORDER BY (minute, model, caller, status)
TTL minute + INTERVAL 90 DAY
-- A retried insert into runs is deduplicated here too (the sink sets
-- deduplicate_blocks_in_dependent_materialized_views), so a retry is not counted twice.
;

-- Filled only by the view below (on a cluster each shard aggregates its own runs): read-only.
CREATE OR REPLACE TABLE `sys1`.runs_per_minute ON CLUSTER `analytics` AS `sys1`.runs_per_minute_local
ENGINE = Distributed('analytics', 'sys1', 'runs_per_minute_local');

CREATE MATERIALIZED VIEW IF NOT EXISTS `sys1`.runs_per_minute_mv ON CLUSTER `analytics` TO `sys1`.runs_per_minute_local AS
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
FROM `sys1`.runs_local
GROUP BY minute, model, caller, status;

-- 0002_runs_v2

-- 0002: run records of schema version 2. Batches (batch_id, item_id), what a run cost
-- (cost_usd, NULL when unpriced: never a fake 0), the exact result cache (cache_hit), traces
-- (trace_id), human review (review_status, review_item), the abstention policy's verdict and
-- the calibration applied to each answer, and the model each attempt sent.
--
-- Rows stored before this migration read the new columns as their defaults: '' and false,
-- NULL for cost and calibration, and for the nested answers/attempts columns arrays of the
-- same length as their siblings, so ARRAY JOIN keeps working across old and new rows.
ALTER TABLE `sys1`.runs_local ON CLUSTER `analytics`
    ADD COLUMN IF NOT EXISTS batch_id String AFTER subject,
    ADD COLUMN IF NOT EXISTS item_id String AFTER batch_id,
    -- attempts.model[i] is the model sent to attempts.provider[i] ('' when nothing was sent).
    ADD COLUMN IF NOT EXISTS attempts.model Array(LowCardinality(String)) AFTER attempts.provider,
    -- answers.verdict[i] is decided | abstained | reviewed ('' without a policy), under the
    -- policy rule answers.rule[i]. answers.calibrated_probability[i] is the calibrated top
    -- probability: a choice's calibrated probability of the chosen option, a score's of its
    -- most probable level, a noul's calibrated P(yes); NULL, like answers.temperature[i],
    -- when no fit applied.
    ADD COLUMN IF NOT EXISTS answers.verdict Array(LowCardinality(String)) AFTER answers.probabilities,
    ADD COLUMN IF NOT EXISTS answers.rule Array(LowCardinality(String)) AFTER answers.verdict,
    ADD COLUMN IF NOT EXISTS answers.calibrated_probability Array(Nullable(Float64)) AFTER answers.rule,
    ADD COLUMN IF NOT EXISTS answers.temperature Array(Nullable(Float64)) AFTER answers.calibrated_probability,
    -- the verdicts as the reply carried them (JSON, '' without a policy): reasons, calibrated
    -- distributions, reviewers' labels
    ADD COLUMN IF NOT EXISTS verdicts String CODEC(ZSTD(3)) AFTER result,
    ADD COLUMN IF NOT EXISTS review_status LowCardinality(String) AFTER verdicts,
    ADD COLUMN IF NOT EXISTS review_item String AFTER review_status,
    ADD COLUMN IF NOT EXISTS cache_hit Bool AFTER review_item,
    ADD COLUMN IF NOT EXISTS cost_usd Nullable(Float64) AFTER cache_hit,
    ADD COLUMN IF NOT EXISTS trace_id String AFTER schema_version;

-- A batch's runs and a trace's run are found without reading every run.
ALTER TABLE `sys1`.runs_local ON CLUSTER `analytics`
    ADD INDEX IF NOT EXISTS runs_batch_id batch_id TYPE bloom_filter GRANULARITY 4,
    ADD INDEX IF NOT EXISTS runs_trace_id trace_id TYPE bloom_filter GRANULARITY 4;

-- On a cluster the Distributed table takes the new structure.
CREATE OR REPLACE TABLE `sys1`.runs ON CLUSTER `analytics` AS `sys1`.runs_local
ENGINE = Distributed('analytics', 'sys1', 'runs_local', cityHash64(run_id));

-- 0003_labels

-- 0003: labels (the truth about an answer, from reviewers and producers) and the view that
-- joins each with the answer it labels, which `sys1 calibrate` reads.

-- One row per checked label (sys1.labels.<caller>.accepted). Under FINAL only the latest label
-- of a run's question is left: the one accepted last (accepted_at is the time the checked
-- label reached SYS1_LABELS, stamped by the NATS server, never a time the submitter chose).
-- No partitions: a relabel months later must still replace the first label.
CREATE TABLE IF NOT EXISTS `sys1`.labels_local ON CLUSTER `analytics`
(
    run_id        String,
    question      String,
    -- the run's verified caller
    caller        LowCardinality(String),
    -- the label as text: the option key (choice), 'true'/'false' (noul), the level index in
    -- decimal (score); value is the same as JSON
    label         String,
    value         String,
    reviewer      LowCardinality(String),
    -- review (the review page) or producer (ground truth from the producer)
    source        LowCardinality(String),
    -- the review item it answers (source review)
    item          String,
    labelled_at   DateTime64(3, 'UTC'),
    accepted_at   DateTime64(6, 'UTC'),
    labels_stream LowCardinality(String),
    labels_seq    UInt64,
    inserted_at   DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', accepted_at)
ORDER BY (run_id, question)
TTL toDateTime(accepted_at) + INTERVAL 90 DAY;

-- Labels shard like runs (by run id), so a run and its labels live on the same shard.
CREATE OR REPLACE TABLE `sys1`.labels ON CLUSTER `analytics` AS `sys1`.labels_local
ENGINE = Distributed('analytics', 'sys1', 'labels_local', cityHash64(run_id));

-- The dead-letter table also parks what the label sink cannot store: kind is run (a run record
-- the sink cannot store), label (an accepted label it cannot store) or rejected_label (a
-- submitted label the workers refused, with their reason in error).
ALTER TABLE `sys1`.runs_dead_letter_local ON CLUSTER `analytics`
    ADD COLUMN IF NOT EXISTS kind LowCardinality(String) DEFAULT 'run' AFTER received_at;

CREATE OR REPLACE TABLE `sys1`.runs_dead_letter ON CLUSTER `analytics` AS `sys1`.runs_dead_letter_local
ENGINE = Distributed('analytics', 'sys1', 'runs_dead_letter_local', cityHash64(runs_stream, runs_seq));

-- One row per labelled question (its latest label) with the answer it labels. predicted is
-- what the answer said: the chosen option (choice), 'true' when P(yes) ≥ 0.5 (noul), the most
-- probable level's index (score, the lowest on a tie); correct is predicted = label.
-- prob_keys/prob_values are the answer's raw distribution in order (noul: ['false', 'true'],
-- [1 − P(yes), P(yes)]; score: by level index), label_probability the probability the answer
-- gave the label. The columns `sys1 calibrate` reads have exactly the types it reads them as
-- (plain String, not LowCardinality). GLOBAL: on a cluster the labels are read once and sent
-- to every shard.
CREATE OR REPLACE VIEW `sys1`.labelled_answers ON CLUSTER `analytics` AS
SELECT
    r.run_id                       AS run_id,
    CAST(r.caller AS String)       AS caller,
    CAST(r.provider AS String)     AS provider,
    CAST(r.model AS String)        AS model,
    CAST(r.question AS String)     AS question,
    CAST(r.type AS String)         AS type,
    r.finished_at                  AS finished_at,
    l.labelled_at                  AS labelled_at,
    r.predicted                    AS predicted,
    l.label                        AS label,
    toUInt8(r.predicted = l.label) AS correct,
    r.confidence                   AS confidence,
    toFloat64(arrayElement(r.prob_values, indexOf(r.prob_keys, l.label))) AS label_probability,
    r.prob_keys                    AS prob_keys,
    r.prob_values                  AS prob_values,
    CAST(l.reviewer AS String)     AS reviewer,
    CAST(l.source AS String)       AS source,
    l.item                         AS item,
    l.accepted_at       AS accepted_at,
    r.verdict           AS verdict,
    r.rule              AS rule,
    r.calibrated_probability AS calibrated_probability,
    r.temperature       AS temperature,
    r.batch_id          AS batch_id
FROM
(
    SELECT run_id, question, label, reviewer, source, item, labelled_at, accepted_at
    FROM `sys1`.labels FINAL
) AS l
GLOBAL INNER JOIN
(
    SELECT
        run_id, caller, provider, model, finished_at, batch_id,
        answers.name                   AS question,
        answers.type                   AS type,
        answers.confidence             AS confidence,
        answers.verdict                AS verdict,
        answers.rule                   AS rule,
        answers.calibrated_probability AS calibrated_probability,
        answers.temperature            AS temperature,
        multiIf(answers.type = 'noul', ['false', 'true'],
                answers.type = 'score', arraySort(k -> toUInt32OrZero(k), mapKeys(answers.probabilities)),
                mapKeys(answers.probabilities)) AS prob_keys,
        multiIf(answers.type = 'noul', [1 - ifNull(answers.noul, 0), ifNull(answers.noul, 0)],
                answers.type = 'score', arraySort((v, k) -> toUInt32OrZero(k), mapValues(answers.probabilities), mapKeys(answers.probabilities)),
                mapValues(answers.probabilities)) AS prob_values,
        multiIf(answers.type = 'choice', toString(answers.choice),
                answers.type = 'noul', if(ifNull(answers.noul, 0) >= 0.5, 'true', 'false'),
                empty(prob_values), toString(toUInt32(round(ifNull(answers.score, 0)))),
                prob_keys[indexOf(prob_values, arrayMax(prob_values))]) AS predicted
    FROM `sys1`.runs FINAL
    ARRAY JOIN answers
    WHERE run_id GLOBAL IN (SELECT run_id FROM `sys1`.labels)
) AS r
ON r.run_id = l.run_id AND r.question = l.question;

-- 0004_views

-- 0004: views for spend and batches. They read runs FINAL, so their figures are exact.

-- Spend per caller per day. spend_usd sums the priced runs' cost_usd; it is NULL when no run of
-- the group was priced (unpriced runs are never counted as $0: unpriced_runs says how many the
-- sum leaves out). Cache hits cost a real 0.
CREATE OR REPLACE VIEW `sys1`.spend_by_caller_day ON CLUSTER `analytics` AS
SELECT
    toDate(finished_at)              AS day,
    caller,
    count()                          AS runs,
    countIf(isNotNull(cost_usd))     AS priced_runs,
    countIf(isNull(cost_usd))        AS unpriced_runs,
    countIf(cache_hit)               AS cache_hits,
    sum(cost_usd)                    AS spend_usd,
    sum(input_tokens)                AS input_tokens,
    sum(output_tokens)               AS output_tokens
FROM `sys1`.runs FINAL
GROUP BY day, caller;

-- Spend per provider and model per day, the same way.
CREATE OR REPLACE VIEW `sys1`.spend_by_model_day ON CLUSTER `analytics` AS
SELECT
    toDate(finished_at)              AS day,
    provider,
    model,
    count()                          AS runs,
    countIf(isNotNull(cost_usd))     AS priced_runs,
    countIf(isNull(cost_usd))        AS unpriced_runs,
    countIf(cache_hit)               AS cache_hits,
    sum(cost_usd)                    AS spend_usd,
    sum(input_tokens)                AS input_tokens,
    sum(output_tokens)               AS output_tokens
FROM `sys1`.runs FINAL
GROUP BY day, provider, model;

-- One row per batch: how far it got and how it went. failed_by_code counts the failed runs by
-- error code. Items not yet finished have no run row: compare runs with the batch's size.
CREATE OR REPLACE VIEW `sys1`.batch_progress ON CLUSTER `analytics` AS
SELECT
    caller,
    batch_id,
    count()                                                 AS runs,
    countIf(status = 'success')                             AS succeeded,
    countIf(status = 'failed')                              AS failed,
    sumMapIf(map(error_code, toUInt64(1)), status = 'failed') AS failed_by_code,
    countIf(has(answers.verdict, 'abstained'))              AS runs_with_abstentions,
    countIf(cache_hit)                                      AS cache_hits,
    sum(cost_usd)                                           AS spend_usd,
    countIf(isNull(cost_usd))                               AS unpriced_runs,
    sum(input_tokens)                                       AS input_tokens,
    sum(output_tokens)                                      AS output_tokens,
    min(published_at)                                       AS first_published,
    max(finished_at)                                        AS last_finished
FROM `sys1`.runs FINAL
WHERE batch_id != ''
GROUP BY caller, batch_id;

-- A batch's runs counted by status and error code ('' on success).
CREATE OR REPLACE VIEW `sys1`.batch_outcomes ON CLUSTER `analytics` AS
SELECT
    caller,
    batch_id,
    status,
    error_code,
    count()            AS runs,
    max(finished_at)   AS last_finished
FROM `sys1`.runs FINAL
WHERE batch_id != ''
GROUP BY caller, batch_id, status, error_code;

-- 0005_audit_share

-- 0005: the audit share of every decided answer (run records of schema version 3 carry it in
-- verdicts[].audit_share), so that sys1 calibrate can weigh audit labels by the inverse of
-- their chance of being drawn and estimate the error of the traffic without bias.

-- answers.audit_share[i] is answer i's audit share (the audit_sample of the rule that decided
-- it), 0 when it abstained, its rule samples nothing, or its record predates schema version 3.
-- Rows stored before this migration read it as 0, an array as long as their other answers
-- columns, so ARRAY JOIN keeps working across old and new rows.
ALTER TABLE `sys1`.runs_local ON CLUSTER `analytics`
    ADD COLUMN IF NOT EXISTS answers.audit_share Array(Float64) AFTER answers.temperature;

-- On a cluster the Distributed table takes the new structure.
CREATE OR REPLACE TABLE `sys1`.runs ON CLUSTER `analytics` AS `sys1`.runs_local
ENGINE = Distributed('analytics', 'sys1', 'runs_local', cityHash64(run_id));

-- labelled_answers again, with audit_share: the chance a decided answer had of being sampled
-- for review (0 on abstained answers, on rules that sample nothing, and on runs recorded
-- before this migration, whose share is unknown); sys1 calibrate weighs an audit label by its
-- inverse. verdict is now plain String, like the other columns sys1 calibrate reads.
-- Otherwise as in 0003: one row per labelled question (its latest label) with the answer it
-- labels. predicted is what the answer said: the chosen option (choice), 'true' when
-- P(yes) ≥ 0.5 (noul), the most probable level's index (score, the lowest on a tie); correct
-- is predicted = label.
-- prob_keys/prob_values are the answer's raw distribution in order (noul: ['false', 'true'],
-- [1 − P(yes), P(yes)]; score: by level index), label_probability the probability the answer
-- gave the label. The columns `sys1 calibrate` reads have exactly the types it reads them as
-- (plain String, not LowCardinality). GLOBAL: on a cluster the labels are read once and sent
-- to every shard.
CREATE OR REPLACE VIEW `sys1`.labelled_answers ON CLUSTER `analytics` AS
SELECT
    r.run_id                       AS run_id,
    CAST(r.caller AS String)       AS caller,
    CAST(r.provider AS String)     AS provider,
    CAST(r.model AS String)        AS model,
    CAST(r.question AS String)     AS question,
    CAST(r.type AS String)         AS type,
    r.finished_at                  AS finished_at,
    l.labelled_at                  AS labelled_at,
    r.predicted                    AS predicted,
    l.label                        AS label,
    toUInt8(r.predicted = l.label) AS correct,
    r.confidence                   AS confidence,
    toFloat64(arrayElement(r.prob_values, indexOf(r.prob_keys, l.label))) AS label_probability,
    r.prob_keys                    AS prob_keys,
    r.prob_values                  AS prob_values,
    CAST(l.reviewer AS String)     AS reviewer,
    CAST(l.source AS String)       AS source,
    l.item                         AS item,
    l.accepted_at       AS accepted_at,
    CAST(r.verdict AS String) AS verdict,
    r.rule              AS rule,
    r.calibrated_probability AS calibrated_probability,
    r.temperature       AS temperature,
    r.batch_id          AS batch_id,
    r.audit_share       AS audit_share
FROM
(
    SELECT run_id, question, label, reviewer, source, item, labelled_at, accepted_at
    FROM `sys1`.labels FINAL
) AS l
GLOBAL INNER JOIN
(
    SELECT
        run_id, caller, provider, model, finished_at, batch_id,
        answers.name                   AS question,
        answers.type                   AS type,
        answers.confidence             AS confidence,
        answers.verdict                AS verdict,
        answers.rule                   AS rule,
        answers.calibrated_probability AS calibrated_probability,
        answers.temperature            AS temperature,
        answers.audit_share            AS audit_share,
        multiIf(answers.type = 'noul', ['false', 'true'],
                answers.type = 'score', arraySort(k -> toUInt32OrZero(k), mapKeys(answers.probabilities)),
                mapKeys(answers.probabilities)) AS prob_keys,
        multiIf(answers.type = 'noul', [1 - ifNull(answers.noul, 0), ifNull(answers.noul, 0)],
                answers.type = 'score', arraySort((v, k) -> toUInt32OrZero(k), mapValues(answers.probabilities), mapKeys(answers.probabilities)),
                mapValues(answers.probabilities)) AS prob_values,
        multiIf(answers.type = 'choice', toString(answers.choice),
                answers.type = 'noul', if(ifNull(answers.noul, 0) >= 0.5, 'true', 'false'),
                empty(prob_values), toString(toUInt32(round(ifNull(answers.score, 0)))),
                prob_keys[indexOf(prob_values, arrayMax(prob_values))]) AS predicted
    FROM `sys1`.runs FINAL
    ARRAY JOIN answers
    WHERE run_id GLOBAL IN (SELECT run_id FROM `sys1`.labels)
) AS r
ON r.run_id = l.run_id AND r.question = l.question;

-- 0006_review_items

-- 0006: every review item of a run. review_item is the first item's id; review_items lists
-- them all, in question order (a run with two abstained questions has two). Rows stored
-- before this migration, and records written before replies named every item, have
-- review_items = [review_item] when they went to review (the sink fills it from review_item),
-- else [].
ALTER TABLE `sys1`.runs_local ON CLUSTER `analytics`
    ADD COLUMN IF NOT EXISTS review_items Array(String) AFTER review_item;

-- On a cluster the Distributed table takes the new structure.
CREATE OR REPLACE TABLE `sys1`.runs ON CLUSTER `analytics` AS `sys1`.runs_local
ENGINE = Distributed('analytics', 'sys1', 'runs_local', cityHash64(run_id));
