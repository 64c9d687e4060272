-- sys1 analyst kit: questions answered from ClickHouse.
--
-- Tables (database sys1 by default; replace "sys1." if SYS1_CLICKHOUSE_DATABASE differs):
--   sys1.runs              one row per run under FINAL; answers/attempts/images as arrays
--   sys1.labels            the latest label per run and question under FINAL
--   sys1.labelled_answers  (view) each labelled question with its answer and label
--   sys1.runs_per_minute   per-minute aggregates by model, caller, status (fed by a view)
--   sys1.spend_by_caller_day, sys1.spend_by_model_day, sys1.batch_progress,
--   sys1.batch_outcomes    (views) spend and batches
--   sys1.runs_dead_letter  what the sink could not store, and rejected labels
--
-- Read runs with FINAL for exact counts: a record the sink had to write twice is one row only
-- under FINAL. runs_per_minute is cheap for dashboards; its counts are per inserted row.
-- Queries about one batch take it as a parameter: clickhouse-client --param_batch_id=…
-- (or SET param_batch_id = '…' in a session).
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

-- 12. Operations: what the sink could not store, and labels the workers refused, by kind and
--     reason, over the last 7 days. kind is run, label or rejected_label; look a message up in
--     its stream (runs_stream: SYS1_RUNS or SYS1_LABELS) by runs_seq while the stream holds it.
SELECT
    kind,
    runs_stream,
    error,
    count()                 AS n_records,
    min(runs_seq)           AS first_seq,
    max(runs_seq)           AS last_seq,
    max(received_at)        AS last_received
FROM sys1.runs_dead_letter FINAL
WHERE received_at >= now() - INTERVAL 7 DAY
GROUP BY kind, runs_stream, error
ORDER BY n_records DESC;

-- 13. Accuracy by confidence bucket (buckets of 0.1) per question over the last 30 days of
--     labels: a calibrated model's accuracy in a bucket matches the bucket's confidence;
--     confidence is concentration, so expect a gap until `sys1 calibrate` has fitted it.
SELECT
    question,
    floor(confidence * 10) / 10           AS confidence_bucket,
    count()                               AS n_labelled,
    round(avg(correct), 3)                AS accuracy,
    round(avg(label_probability), 3)      AS mean_probability_of_label
FROM sys1.labelled_answers
WHERE isNotNull(confidence)
  AND labelled_at >= now() - INTERVAL 30 DAY
GROUP BY question, confidence_bucket
ORDER BY question, confidence_bucket;

-- 14. Abstention rate by caller and question over the last 7 days: how often the policy held
--     an answer back (answers.verdict is '' for runs without a policy, left out here).
SELECT
    caller,
    answers.name                                            AS question,
    count()                                                 AS n_answers,
    countIf(answers.verdict = 'abstained')                  AS n_abstained,
    round(countIf(answers.verdict = 'abstained') / count(), 4) AS abstention_rate,
    countIf(answers.verdict = 'reviewed')                   AS n_reviewed
FROM sys1.runs FINAL
ARRAY JOIN answers
WHERE answers.verdict != ''
  AND finished_at >= now() - INTERVAL 7 DAY
GROUP BY caller, question
ORDER BY abstention_rate DESC, n_answers DESC;

-- 15. Reviewer throughput per day over the last 30 days: labels per reviewer from the review
--     page, how often they agreed with the model, and how long a run waited for its label.
SELECT
    toDate(labelled_at)                                             AS day,
    reviewer,
    count()                                                         AS n_labels,
    uniqExact(run_id)                                               AS n_runs,
    round(avg(correct), 3)                                          AS agreement_with_model,
    round(quantile(0.5)(dateDiff('second', finished_at, labelled_at)) / 60, 1) AS median_minutes_to_label
FROM sys1.labelled_answers
WHERE source = 'review'
  AND labelled_at >= now() - INTERVAL 30 DAY
GROUP BY day, reviewer
ORDER BY day DESC, n_labels DESC;

-- 16. A batch's label distribution: per question, how often each answer was given (choice: the
--     option; noul: true when P(yes) ≥ 0.5; score: the rounded level) and how many of those
--     the policy held back. Parameter: batch_id.
SELECT
    answers.name                                                  AS question,
    multiIf(answers.type = 'choice', toString(answers.choice),
            answers.type = 'noul', if(answers.noul >= 0.5, 'true', 'false'),
            toString(toUInt32(round(ifNull(answers.score, 0)))))  AS answer,
    count()                                                       AS n_answers,
    round(count() / sum(count()) OVER (PARTITION BY answers.name), 4) AS share,
    countIf(answers.verdict = 'abstained')                        AS n_abstained
FROM sys1.runs FINAL
ARRAY JOIN answers
WHERE batch_id = {batch_id:String}
GROUP BY question, answer
ORDER BY question, n_answers DESC;

-- 17. A batch's failures, item by item, with every attempt's outcome. Parameter: batch_id.
SELECT
    item_id,
    run_id,
    error_code,
    error_message,
    deliveries,
    arrayZip(attempts.provider, attempts.model, attempts.outcome)  AS attempts_provider_model_outcome,
    finished_at
FROM sys1.runs FINAL
WHERE batch_id = {batch_id:String}
  AND status = 'failed'
ORDER BY length(item_id), item_id
LIMIT 1000;

-- 18. Every batch's progress, newest first: runs finished so far, outcomes, failures by code,
--     spend (NULL when nothing was priced) and how long it has run.
SELECT
    caller,
    batch_id,
    runs,
    succeeded,
    failed,
    failed_by_code,
    runs_with_abstentions,
    spend_usd,
    unpriced_runs,
    dateDiff('second', first_published, last_finished) AS seconds_so_far
FROM sys1.batch_progress
ORDER BY last_finished DESC
LIMIT 50;

-- 19. Spend per caller per day over the last 30 days, and per model: spend_usd sums the priced
--     runs and is NULL when none was priced; unpriced_runs says how many are not in it.
SELECT day, caller, runs, priced_runs, unpriced_runs, cache_hits, round(spend_usd, 6) AS spend_usd
FROM sys1.spend_by_caller_day
WHERE day >= today() - 30
ORDER BY day DESC, spend_usd DESC NULLS LAST;

-- 20. Spend per model over the last 30 days, with the cost of a thousand runs.
SELECT
    provider,
    model,
    sum(runs)                                             AS total_runs,
    sum(unpriced_runs)                                    AS unpriced,
    round(sum(spend_usd), 6)                              AS total_spend_usd,
    round(sum(spend_usd) / sum(priced_runs) * 1000, 4)    AS usd_per_1000_priced_runs
FROM sys1.spend_by_model_day
WHERE day >= today() - 30
GROUP BY provider, model
ORDER BY total_spend_usd DESC NULLS LAST;
