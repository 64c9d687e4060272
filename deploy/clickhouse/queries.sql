-- sys1 analyst kit: questions answered from ClickHouse.
--
-- Tables (database sys1 by default; replace "sys1." if SYS1_CLICKHOUSE_DATABASE differs):
--   sys1.runs             one row per run under FINAL; answers/attempts/images as arrays
--   sys1.runs_per_minute  per-minute aggregates by model, caller, status (fed by a view)
--   sys1.runs_dead_letter records the sink could not store
--
-- Read runs with FINAL for exact counts: a record the sink had to write twice is one row only
-- under FINAL. runs_per_minute is cheap for dashboards; its counts are per inserted row.
-- Every query below is run against a populated database by sink/queries_test.go.

-- 1. Latency percentiles per model over the last 7 days (from the per-minute view: fast at any
--    volume). p50/p90/p95/p99 in milliseconds, plus the error rate.
SELECT
    model,
    sum(runs)                                             AS total_runs,
    round(sum(errors) / sum(runs), 4)                     AS error_rate,
    arrayMap(x -> round(x), quantilesMerge(0.5, 0.9, 0.95, 0.99)(latency_ms_q)) AS latency_p50_p90_p95_p99_ms
FROM sys1.runs_per_minute
WHERE minute >= now() - INTERVAL 7 DAY
GROUP BY model
ORDER BY total_runs DESC;

-- 2. Error mix per caller over the last 7 days: which codes each caller gets, and what share
--    of that caller's runs they are.
SELECT
    caller,
    error_code,
    count()                                                        AS runs,
    round(count() / sum(count()) OVER (PARTITION BY caller), 4)    AS share_of_caller_runs
FROM sys1.runs FINAL
WHERE finished_at >= now() - INTERVAL 7 DAY
GROUP BY caller, error_code
ORDER BY caller, runs DESC;

-- 3. Which callers get the most SYS1_MODEL_UNAVAILABLE (a model that is allowed but not pulled
--    upstream: an operations fault), and for which models.
SELECT
    caller,
    count()                        AS unavailable_runs,
    groupUniqArray(model)          AS models,
    max(finished_at)               AS last_seen
FROM sys1.runs FINAL
WHERE error_code = 'SYS1_MODEL_UNAVAILABLE'
  AND finished_at >= now() - INTERVAL 7 DAY
GROUP BY caller
ORDER BY unavailable_runs DESC
LIMIT 20;

-- 4. Answer distribution per choice question: how often each option was chosen and how
--    confident the model was when it chose it.
SELECT
    answers.name                                                        AS question,
    answers.choice                                                      AS choice,
    count()                                                             AS n_answers,
    round(count() / sum(count()) OVER (PARTITION BY answers.name), 4)   AS share,
    round(avg(answers.confidence), 3)                                   AS avg_confidence
FROM sys1.runs FINAL
ARRAY JOIN answers
WHERE answers.type = 'choice'
  AND finished_at >= now() - INTERVAL 7 DAY
GROUP BY question, choice
ORDER BY question, n_answers DESC;

-- 5. Confidence histogram per question (buckets of 0.1): are answers decisive or hedged?
SELECT
    answers.name                                        AS question,
    floor(answers.confidence * 10) / 10                 AS confidence_bucket,
    count()                                             AS n_answers,
    bar(count(), 0, max(count()) OVER (PARTITION BY answers.name), 30) AS histogram
FROM sys1.runs FINAL
ARRAY JOIN answers
WHERE isNotNull(answers.confidence)
  AND finished_at >= now() - INTERVAL 7 DAY
GROUP BY question, confidence_bucket
ORDER BY question, confidence_bucket;

-- 6. Token usage per caller per day over the last 30 days (from the per-minute view).
SELECT
    toDate(minute)       AS day,
    caller,
    sum(runs)            AS total_runs,
    sum(input_tokens)    AS total_input_tokens,
    sum(output_tokens)   AS total_output_tokens,
    round(sum(input_tokens) / sum(runs), 1) AS input_tokens_per_run
FROM sys1.runs_per_minute
WHERE minute >= now() - INTERVAL 30 DAY
GROUP BY day, caller
ORDER BY day DESC, total_input_tokens DESC;

-- 7. Runs that needed retries in the last 24 hours: every attempt's outcome and code, newest
--    first. attempts.* are parallel arrays in attempt order.
SELECT
    run_id,
    caller,
    model,
    status,
    deliveries,
    length(attempts.outcome)                            AS n_attempts,
    arrayZip(attempts.outcome, attempts.error_code)     AS outcomes_and_codes,
    latency_ms,
    finished_at
FROM sys1.runs FINAL
WHERE length(attempts.outcome) > 1
  AND finished_at >= now() - INTERVAL 1 DAY
ORDER BY finished_at DESC
LIMIT 100;

-- 8. Retry pressure per model: how often each attempt outcome occurs and how long it takes
--    (busy/unavailable/timeout outcomes point at capacity or operations problems).
SELECT
    model,
    attempts.outcome                        AS outcome,
    count()                                 AS n_attempts,
    round(avg(attempts.latency_ms))         AS avg_attempt_ms
FROM sys1.runs FINAL
ARRAY JOIN attempts
WHERE finished_at >= now() - INTERVAL 7 DAY
GROUP BY model, outcome
ORDER BY model, n_attempts DESC;

-- 9. Yes/no and score questions: mean P(true) for noul questions and the mean and spread of
--    score answers, per question and model.
SELECT
    answers.name                        AS question,
    answers.type                        AS type,
    model,
    count()                             AS n_answers,
    round(avg(answers.noul), 3)         AS mean_p_true,
    round(avg(answers.score), 3)        AS mean_score,
    round(stddevPop(answers.score), 3)  AS score_stddev
FROM sys1.runs FINAL
ARRAY JOIN answers
WHERE answers.type IN ('noul', 'score')
  AND finished_at >= now() - INTERVAL 7 DAY
GROUP BY question, type, model
ORDER BY question, model;

-- 10. Throughput and health per minute over the last 3 hours (dashboard panel from the
--     view): runs, errors, p95 latency and p95 queue time.
SELECT
    minute,
    sum(runs)                                                  AS total_runs,
    sum(errors)                                                AS total_errors,
    round(quantilesMerge(0.5, 0.9, 0.95, 0.99)(latency_ms_q)[3]) AS latency_p95_ms,
    round(quantilesMerge(0.5, 0.9, 0.95, 0.99)(queued_ms_q)[3])  AS queued_p95_ms,
    uniqMerge(runs_distinct)                                   AS distinct_runs
FROM sys1.runs_per_minute
WHERE minute >= now() - INTERVAL 3 HOUR
GROUP BY minute
ORDER BY minute;

-- 11. Slowest successful runs this week, with where the time went (queue vs provider).
SELECT
    run_id, caller, model, queued_ms, latency_ms,
    length(attempts.outcome) AS n_attempts, length(images.sha256) AS n_images, input_tokens
FROM sys1.runs FINAL
WHERE status = 'success'
  AND finished_at >= now() - INTERVAL 7 DAY
ORDER BY latency_ms DESC
LIMIT 20;

-- 12. Operations: records the sink could not store, by reason, over the last 7 days. Look a
--     record up in SYS1_RUNS by runs_seq while the stream still holds it.
SELECT
    error,
    count()                 AS n_records,
    min(runs_seq)           AS first_seq,
    max(runs_seq)           AS last_seq,
    max(received_at)        AS last_received
FROM sys1.runs_dead_letter FINAL
WHERE received_at >= now() - INTERVAL 7 DAY
GROUP BY error
ORDER BY n_records DESC;
